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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import mcp_types as types
import msgspec
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from redis.exceptions import ConnectionError, TimeoutError

from broker import Agent, AskUserQuestionAnswer, AskUserQuestionRequest, Broker, UserQuestionError
from broker.errors import ASK_TIMED_OUT, BAD_REQUEST, BROKER_UNAVAILABLE, NO_PROVIDER, NO_TOKENS, UNAUTHENTICATED
from broker.types import convert_request, encode
from workers.asking.gateway.listen import is_loopback
from workers.asking.gateway.tokens import Tokens, bearer
from workers.asking.mcp.elicit import answer_from, form_for, message_for, supports_elicitation

__all__ = [
    "INPUT_SCHEMA",
    "OUTPUT_SCHEMA",
    "TOOL_NAME",
    "AskService",
    "Caller",
    "McpSettings",
    "build_server",
    "parse_arguments",
    "serve",
]

log = logging.getLogger(__name__)

TOOL_NAME = "ask_user_question"

_DESCRIPTION = (
    "Ask the human a batch of structured questions and wait for the answer. Each question has "
    "`question` text, optional `detail` (supporting text, e.g. plan markdown), a short `header`, "
    "`options` ({label, description}; the chosen labels come back verbatim), `multiSelect`, and "
    "an optional `intent` (for a plan review: {kind: 'plan-review', approve: <label of the "
    "approving option>}, with the plan in `detail`). `id` is optional: answers echo it, and "
    "questions without one are answered with generated ids plus their `question` text. The "
    "result is {answers: [{id, selected: [labels], custom?}]}: `custom` is free text the human "
    "typed instead; an item with empty `selected` and no `custom` was skipped. On failure the "
    "result is an error {name, code, message}: route on `code` (ASK_CANCELLED: the human "
    "dismissed it; ASK_TIMED_OUT: nobody answered in time; NO_PROVIDER: no UI is running; "
    "BAD_REQUEST / BAD_INTENT / EMPTY_QUESTIONS: fix the call)."
)

_OPTION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "label": {"type": "string", "description": "what the human sees and what comes back"},
                "description": {"type": "string"},
            },
            "required": ["label"],
        },
        {"type": "string", "description": "shorthand for {label}"},
    ]
}

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array",
            "description": "the questions, asked together as one batch",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "caller-chosen, echoed in the answer (optional)"},
                    "question": {"type": "string"},
                    "detail": {"type": "string", "description": "supporting text shown with the question"},
                    "header": {"type": "string", "description": "a short group label"},
                    "options": {"type": "array", "items": _OPTION_SCHEMA},
                    "multiSelect": {"type": "boolean", "default": False},
                    "multi_select": {"type": "boolean", "description": "alias of multiSelect"},
                    "intent": {
                        "type": "object",
                        "description": "presentation intent, e.g. {kind: 'plan-review', approve: 'Approve'}",
                        "properties": {"kind": {"type": "string"}, "approve": {"type": "string"}},
                        "required": ["kind"],
                    },
                },
                "required": ["question"],
            },
        },
        "timeoutSeconds": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "give up (ASK_TIMED_OUT) when nobody answered within this many seconds",
        },
        "key": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "name the question durably: if this session stops before the answer, asking the "
            "same questions with the same key later gets the answer (or waits on the same question)",
        },
        "remember": {
            "type": "boolean",
            "default": True,
            "description": "false: always ask a human, even when the team remembered an answer to this question",
        },
        "priority": {
            "enum": ["urgent", "normal", "low"],
            "default": "normal",
            "description": "how soon a human should see it: urgent questions are presented first",
        },
        "coalesce": {
            "type": "boolean",
            "default": True,
            "description": "false: present it on its own even when other agents ask the identical question",
        },
    },
    "required": ["questions"],
}


OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answers": {
            "type": "array",
            "description": "one item per question, in question order",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "the question's id (generated: q1, q2, ...)"},
                    "selected": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "the chosen option labels; empty with no custom: skipped",
                    },
                    "custom": {"type": "string", "description": "free text the human typed instead"},
                    "question": {"type": "string", "description": "the question's text, when it came without an id"},
                },
                "required": ["id", "selected"],
            },
        },
        "name": {"type": "string", "description": "a failure's error class: UserQuestionError"},
        "code": {
            "type": "string",
            "description": "a failure's stable code (ASK_CANCELLED, ASK_TIMED_OUT, NO_PROVIDER, ...): route on it",
        },
        "message": {"type": "string", "description": "a failure's explanation, for the model"},
    },
    # An answer, or (isError) the coded failure: the specification wants every structured result to fit
    # the schema, and the official TypeScript client validates errors too (one that does not fit is a
    # protocol error there, where the model should have read the code).
    "oneOf": [{"required": ["answers"]}, {"required": ["name", "code", "message"]}],
}


# -- the tool's input: the seeds' request, or what popular coding agents emit ------------


class _InOption(msgspec.Struct, kw_only=True):
    label: str
    description: str | None = None


class _InItem(msgspec.Struct, kw_only=True):
    question: str
    id: str | None = None
    detail: str | None = None
    header: str | None = None
    options: list[_InOption | str] | None = None
    multi_select_camel: bool | None = msgspec.field(default=None, name="multiSelect")
    multi_select: bool | None = None
    intent: dict[str, Any] | None = None


class _InRequest(msgspec.Struct, kw_only=True):
    questions: list[_InItem]
    timeout_seconds: float | None = msgspec.field(default=None, name="timeoutSeconds")
    key: str | None = None
    remember: bool = True
    priority: str | None = None
    coalesce: bool = True


@dataclass(frozen=True)
class ParsedCall:
    request: AskUserQuestionRequest
    timeout: float | None
    key: str | None
    generated: dict[str, str]
    """question text by generated id, for the questions that came without an id"""
    remember: bool = True
    """False: a remembered decision may not answer it"""
    coalesce: bool = True
    """False: never presented together with identical questions of other agents"""


def parse_arguments(arguments: dict[str, Any] | None) -> ParsedCall:
    """Normalise the tool arguments into a request; ``BAD_REQUEST`` when they do not fit."""
    try:
        raw = msgspec.convert(arguments or {}, _InRequest)
    except msgspec.ValidationError as error:
        raise UserQuestionError(f"the arguments do not fit the tool's schema: {error}", BAD_REQUEST) from error
    if raw.timeout_seconds is not None and not raw.timeout_seconds > 0:
        raise UserQuestionError("timeoutSeconds must be positive", BAD_REQUEST)
    taken = {item.id for item in raw.questions if item.id is not None}
    generated: dict[str, str] = {}
    questions: list[dict[str, Any]] = []
    for index, item in enumerate(raw.questions, start=1):
        qid = item.id
        if qid is None:
            qid = f"q{index}"
            while qid in taken:
                qid += "_"
            taken.add(qid)
            generated[qid] = item.question
        question: dict[str, Any] = {"id": qid, "question": item.question}
        if item.detail is not None:
            question["detail"] = item.detail
        if item.header is not None:
            question["header"] = item.header
        if item.options is not None:
            question["options"] = [
                {"label": o} if isinstance(o, str) else msgspec.structs.asdict(o) for o in item.options
            ]
        multi = item.multi_select_camel if item.multi_select_camel is not None else item.multi_select
        if multi:
            question["multiSelect"] = True
        if item.intent is not None:
            question["intent"] = item.intent
        questions.append(question)
    try:
        request = convert_request({"questions": questions, **({"priority": raw.priority} if raw.priority else {})})
    except msgspec.ValidationError as error:
        raise UserQuestionError(f"the questions do not fit the request schema: {error}", BAD_REQUEST) from error
    return ParsedCall(
        request=request,
        timeout=raw.timeout_seconds,
        key=raw.key,
        generated=generated,
        remember=raw.remember,
        coalesce=raw.coalesce,
    )


def answer_payload(answer: AskUserQuestionAnswer, generated: dict[str, str]) -> dict[str, Any]:
    """The answer as JSON; items of questions that came without an id also carry their text."""
    payload: dict[str, Any] = msgspec.json.decode(encode(answer))
    for item in payload["answers"]:
        if item["id"] in generated:
            item["question"] = generated[item["id"]]
    return payload


def _result(payload: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    text = json.dumps(payload, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=payload, is_error=is_error
    )


def error_result(error: UserQuestionError) -> types.CallToolResult:
    return _result(error.to_dict(), is_error=True)


# -- the service: the broker, this process's agents, the asks in flight -------------------

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")
_REDIS_DOWN = (ConnectionError, TimeoutError, OSError)


def derived_agent_id(client_name: str | None) -> str:
    """``mcp-<client>-<random>``: unique per process, so two servers never evict each other."""
    slug = _SLUG.sub("-", client_name or "").strip("-")[:40] or "client"
    return f"mcp-{slug}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Caller:
    """The MCP side of one tool call: its client, and what that client can do while a human takes their time."""

    client_name: str | None = None
    report_progress: Callable[[float, float | None, str], Awaitable[None]] | None = None
    """send a progress notification (progress, total, message); None: the call asked for none"""
    elicit: Callable[[AskUserQuestionRequest], Awaitable[AskUserQuestionAnswer]] | None = None
    """ask the client's own user; None: the client cannot"""
    agent_id: str | None = None
    """the agent its bearer token names (HTTP with --tokens-file): it asks as that agent, whatever else is set"""


class AskService:
    """Asks on behalf of MCP clients; an async context manager that owns its tasks."""

    def __init__(
        self,
        broker: Broker | Callable[[], Broker],
        *,
        agent_id: str | None = None,
        default_timeout: float | None = None,
        withdraw_grace: float = 5.0,
        progress_interval: float = 10.0,
    ) -> None:
        # A callable gives the broker once it is open (it raises BROKER_UNAVAILABLE until then).
        self._broker = broker if callable(broker) and not isinstance(broker, Broker) else (lambda: broker)
        self.agent_id = agent_id
        self.default_timeout = default_timeout
        self.withdraw_grace = withdraw_grace
        self.progress_interval = progress_interval
        self._agents: dict[str, tuple[asyncio.Future[Agent], asyncio.Event]] = {}
        self._agent_ids: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._stack = AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None

    async def __aenter__(self) -> AskService:
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._stack.callback(self._release_agents)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._tasks = None
        await self._stack.aclose()

    def _release_agents(self) -> None:
        for _ready, release in self._agents.values():
            release.set()

    @property
    def tasks(self) -> asyncio.TaskGroup:
        if self._tasks is None:
            raise UserQuestionError("the MCP service is not running", BROKER_UNAVAILABLE)
        return self._tasks

    async def agent_for(self, client_name: str | None, verified: str | None = None) -> Agent:
        """This process's live agent for the client: registered on first use, renewed if it lapsed.

        ``verified``: the agent a bearer token named, which wins over any configured or derived id.
        """
        async with self._lock:
            key = client_name or ""
            agent_id = verified or self.agent_id or self._agent_ids.setdefault(key, derived_agent_id(client_name))
            held = self._agents.get(agent_id)
            if held is not None:
                ready, release = held
                if not ready.done() or (not ready.cancelled() and ready.exception() is None and ready.result().alive):
                    return await asyncio.shield(ready)
                release.set()  # the old instance lapsed (or never registered): register a new one
            ready = asyncio.get_running_loop().create_future()
            release = asyncio.Event()
            self._agents[agent_id] = (ready, release)  # tracked before awaiting, so exit releases it
            self.tasks.create_task(self._hold(agent_id, ready, release), name=f"qb-mcp-agent-{agent_id}")
        agent = await asyncio.shield(ready)
        log.info("asking as agent %s", agent_id)
        return agent

    async def _hold(self, agent_id: str, ready: asyncio.Future[Agent], release: asyncio.Event) -> None:
        try:
            async with self._broker().agent(agent_id) as agent:
                ready.set_result(agent)
                await release.wait()
        except Exception as error:  # handed to the caller waiting for the registration
            if not ready.done():
                ready.set_exception(error)
            else:
                log.warning("agent %s ended: %s", agent_id, error)
        finally:
            if not ready.done():  # cancelled while registering: nobody waits forever
                ready.cancel()

    async def call(self, arguments: dict[str, Any] | None, caller: Caller | None = None) -> types.CallToolResult:
        """Run one tool call; cancelling it withdraws the question (detaches it, when keyed)."""
        caller = caller or Caller()
        try:
            parsed = parse_arguments(arguments)
            agent = await self.agent_for(caller.client_name, caller.agent_id)
        except UserQuestionError as error:
            return error_result(error)
        except _REDIS_DOWN as error:
            return error_result(UserQuestionError(f"Redis is unreachable: {error}", BROKER_UNAVAILABLE))
        timeout = parsed.timeout if parsed.timeout is not None else self.default_timeout
        task = self.tasks.create_task(self._ask(agent, parsed, timeout), name="qb-mcp-ask")
        try:
            outcome = await self._wait(task, timeout, caller)
        except BaseException:
            # The client cancelled the call or went away: one cancel of the ask task
            # withdraws the question; wait for that, shielded from the caller's own scope.
            task.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.withdraw_grace):
                await asyncio.wait({task})
            raise
        if isinstance(outcome, UserQuestionError) and outcome.code == NO_PROVIDER and caller.elicit is not None:
            outcome = await _elicited(caller.elicit, parsed.request, timeout)
        if isinstance(outcome, UserQuestionError):
            return error_result(outcome)
        return _result(answer_payload(outcome, parsed.generated))

    async def _wait(
        self, task: asyncio.Task[AskUserQuestionAnswer | UserQuestionError], limit_s: float | None, caller: Caller
    ) -> AskUserQuestionAnswer | UserQuestionError:
        """The ask's outcome; meanwhile a progress notification every ``progress_interval``, if asked for."""
        if caller.report_progress is None:
            return await asyncio.shield(task)
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            done, _ = await asyncio.wait({task}, timeout=self.progress_interval)  # never cancels the task
            if done:
                return task.result()
            waited = loop.time() - started
            try:
                await caller.report_progress(waited, limit_s, f"waiting for a human to answer ({waited:.0f} s)")
            except Exception as error:  # a client that cannot take it still gets its answer
                log.debug("progress notification failed: %r", error)

    async def _ask(
        self, agent: Agent, parsed: ParsedCall, limit_s: float | None
    ) -> AskUserQuestionAnswer | UserQuestionError:
        try:
            return await agent.ask(
                parsed.request, timeout=limit_s, key=parsed.key, remember=parsed.remember, coalesce=parsed.coalesce
            )
        except UserQuestionError as error:
            return error
        except _REDIS_DOWN as error:
            return UserQuestionError(f"Redis is unreachable: {error}", BROKER_UNAVAILABLE)
        except Exception as error:  # never let one ask take the service's task group down
            log.exception("ask failed")
            return UserQuestionError(f"the ask failed: {error!r}", BROKER_UNAVAILABLE)


async def _elicited(
    elicit: Callable[[AskUserQuestionRequest], Awaitable[AskUserQuestionAnswer]],
    request: AskUserQuestionRequest,
    limit_s: float | None,
) -> AskUserQuestionAnswer | UserQuestionError:
    """Nobody in the namespace can answer: ask the client's own user instead."""
    try:
        async with asyncio.timeout(limit_s):
            return await elicit(request)
    except UserQuestionError as error:
        return error
    except TimeoutError:
        return UserQuestionError("the user of the MCP client did not answer in time", ASK_TIMED_OUT)
    except Exception as error:  # the client refused or failed the elicitation: nobody could answer
        log.warning("elicitation failed: %r", error)
        return UserQuestionError(f"no provider runs, and the MCP client could not ask its user: {error}", NO_PROVIDER)


# -- the MCP server -------------------------------------------------------------------------


TOOL = types.Tool(
    name=TOOL_NAME,
    title="Ask the user",
    description=_DESCRIPTION,
    input_schema=INPUT_SCHEMA,
    output_schema=OUTPUT_SCHEMA,
    annotations=types.ToolAnnotations(
        title="Ask the user", read_only_hint=True, destructive_hint=False, open_world_hint=False
    ),
)


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
        agent_id=getattr(state, _AGENT_STATE, None),
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


@dataclass(frozen=True, kw_only=True)
class McpSettings:
    redis_url: str
    namespace: str
    transport: Literal["stdio", "http"] = "stdio"
    agent_id: str | None = None
    timeout: float | None = None
    host: str = "127.0.0.1"
    port: int = 8765
    trusted_keys: str = ""
    """the providers' public keys (qbpk1:...): an answer counts only when one of them signed it"""
    progress_interval: float = 10.0
    tokens_file: str | None = None
    """over HTTP: every request needs a bearer token from this file, and asks as the token's agent"""

    def __repr__(self) -> str:  # the URL may carry a password
        return f"McpSettings(namespace={self.namespace!r}, transport={self.transport!r}, agent_id={self.agent_id!r})"


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
        await _serve_http(server, settings, stop or asyncio.Event())


_AGENT_STATE = "qb_agent"


class BearerAuth:
    """ASGI middleware: an HTTP request without a valid bearer token is 401; a valid one names its agent."""

    def __init__(self, app: Any, tokens: Tokens) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or ())
            agent_id = self.tokens.agent_for(bearer(headers.get(b"authorization", b"").decode("latin-1")))
            if agent_id is None:
                error = UserQuestionError("a valid bearer token is required", UNAUTHENTICATED)
                body = json.dumps({"error": error.to_dict()}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            scope.setdefault("state", {})[_AGENT_STATE] = agent_id
        await self.app(scope, receive, send)


def check_listening(settings: McpSettings) -> None:
    """Refuse HTTP beyond loopback without bearer tokens (``NO_TOKENS``)."""
    if settings.transport != "http" or is_loopback(settings.host):
        return
    if settings.tokens_file is None or len(Tokens(settings.tokens_file)) == 0:
        raise UserQuestionError(
            f"refusing to listen on {settings.host}: beyond loopback `qbroker mcp --transport http` needs bearer "
            "tokens (--tokens-file FILE, made with `qbroker gateway token new AGENT`)",
            NO_TOKENS,
        )


async def _serve_http(server: Server[Any], settings: McpSettings, stop: asyncio.Event) -> None:
    import uvicorn

    class _Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the command owns the signals, so the broker closes before the process exits

    app: Any = server.streamable_http_app(host=settings.host)
    if settings.tokens_file is not None:
        app = BearerAuth(app, Tokens(settings.tokens_file))
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_config=None, lifespan="on", timeout_graceful_shutdown=5
    )
    http = _Uvicorn(config)

    async def stop_when_told() -> None:
        await stop.wait()
        http.should_exit = True

    async with asyncio.TaskGroup() as tasks:
        watcher = tasks.create_task(stop_when_told())
        try:
            await http.serve()
        finally:
            watcher.cancel()
