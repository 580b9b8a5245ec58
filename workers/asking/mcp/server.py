"""The broker as an MCP server: one tool, ``ask_user_question``, for any MCP-speaking agent.

The server process registers itself as a live root agent (one instance per MCP client
name, or the fixed ``agent_id`` it was given), so caller gating and "asker gone"
withdrawal work as for a Python agent. Each tool call runs its ask in a task owned by
the service; a client that cancels the call or goes away cancels that task, which
withdraws the question (the UI takes it down).

Failures of an ask are tool errors (``isError``) whose content is ``{name, code, message}``, so
the model can route on the code; it fits the tool's ``outputSchema`` as an answer does. A call of a
tool it does not have is a JSON-RPC error, as the MCP specification says. An answer is structured
content that fits the tool's ``outputSchema``. While a human takes their time, a call that asked for
progress (a ``progressToken``) gets a progress notification every few seconds, so clients that
reset their timeout on progress keep waiting. When nobody can answer (``NO_PROVIDER``) and the
client declared elicitation, the client's own user is asked instead (``workers.asking.mcp.elicit``).

The parts: ``tool`` (the schemas and the arguments), ``service`` (the asks), ``settings``,
``http_transport`` (HTTP and its bearer tokens) and this module, which serves them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, Broker, UserQuestionError
from broker.errors import BROKER_UNAVAILABLE
from workers.asking.mcp.elicit import answer_from, form_for, message_for, supports_elicitation
from workers.asking.mcp.http_transport import AGENT_STATE, serve_http
from workers.asking.mcp.service import AskService, Caller
from workers.asking.mcp.settings import McpSettings
from workers.asking.mcp.tool import TOOL, TOOL_NAME

__all__ = ["build_server", "running_service", "serve"]

log = logging.getLogger(__name__)


def build_server(service: AskService) -> Server[Any]:
    """The low-level MCP server exposing ``ask_user_question`` over ``service``."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[TOOL])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != TOOL_NAME:  # a protocol error, not a tool's failure (MCP spec, "Error Handling")
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        return await service.call(params.arguments, _caller(ctx))

    return Server(
        "question-broker",
        version=_version(),
        instructions="Use ask_user_question to ask the human structured questions and wait for the answer.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _caller(ctx: ServerRequestContext[Any]) -> Caller:
    session = ctx.session
    client = session.client_params
    meta = ctx.meta or {}
    wants_progress = meta.get("progress_token", meta.get("progressToken")) is not None

    async def report(progress: float, total: float | None, message: str) -> None:
        await session.report_progress(progress, total, message)

    async def elicit(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        result = await session.elicit_form(message_for(request), form_for(request), related_request_id=ctx.request_id)
        return answer_from(request, result)

    can_elicit = supports_elicitation(session.client_capabilities) and session.can_send_request
    state = getattr(ctx.request, "state", None)  # the HTTP request that carried the call (None over stdio)
    return Caller(
        agent_id=getattr(state, AGENT_STATE, None),
        client_name=client.client_info.name if client is not None and client.client_info is not None else None,
        report_progress=report if wants_progress else None,
        elicit=elicit if can_elicit else None,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("question-broker")
    except PackageNotFoundError:
        return "0"


class _BrokerSlot:
    """The server's broker, opened (and re-tried) in the background: an MCP client can connect
    and call the tool while Redis is down, and each call then fails with BROKER_UNAVAILABLE."""

    def __init__(self, settings: McpSettings) -> None:
        self._settings = settings
        self._broker: Broker | None = None
        self._why = "connecting to Redis"

    def __call__(self) -> Broker:
        if self._broker is None:
            raise UserQuestionError(f"Redis is unavailable: {self._why}", BROKER_UNAVAILABLE)
        return self._broker

    async def hold(self, tried: asyncio.Event) -> None:
        """Open the broker, trying again every few seconds; keep it open until cancelled.

        ``tried`` is set once the first attempt has ended, either way.
        """
        while True:
            broker = Broker(
                self._settings.redis_url, self._settings.namespace, trusted_keys=self._settings.trusted_keys
            )
            try:
                await broker.__aenter__()
            except UserQuestionError as error:
                self._why = error.message
                tried.set()
                log.warning("Redis is unavailable (%s); trying again in 2s", error.message)
                await asyncio.sleep(2.0)
                continue
            self._broker = broker
            tried.set()
            try:
                await asyncio.Event().wait()
            finally:
                self._broker = None
                await broker.aclose()


@asynccontextmanager
async def running_service(settings: McpSettings) -> AsyncIterator[AskService]:
    slot = _BrokerSlot(settings)
    tried = asyncio.Event()
    holder = asyncio.create_task(slot.hold(tried), name="qb-mcp-broker")
    try:
        await tried.wait()  # then serve either way: calls fail coded until Redis answers
        async with AskService(
            slot,
            agent_id=settings.agent_id,
            default_timeout=settings.timeout,
            progress_interval=settings.progress_interval,
        ) as service:
            yield service
    finally:
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)


async def serve(settings: McpSettings, *, stop: asyncio.Event | None = None) -> None:
    """Serve until the client goes away (stdio), or until ``stop`` is set (http).

    Over stdio, cancel the calling task to stop: calls in flight are cancelled, which
    withdraws their questions. Over http, ``stop`` begins uvicorn's graceful shutdown.
    """
    async with running_service(settings) as service:
        server = build_server(service)
        if settings.transport == "stdio":
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
            return
        await serve_http(server, settings, stop or asyncio.Event())
