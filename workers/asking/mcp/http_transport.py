"""``qbroker mcp --transport http``: streamable HTTP, behind bearer tokens beyond loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

from mcp.server.lowlevel import Server

from broker import UserQuestionError
from broker.errors import NO_TOKENS, UNAUTHENTICATED
from workers.asking.gateway.listen import is_loopback
from workers.asking.gateway.tokens import Tokens, bearer
from workers.asking.mcp.settings import McpSettings

__all__ = ["AGENT_STATE", "BearerAuth", "check_listening", "serve_http"]

AGENT_STATE = "qb_agent"
"""the key of an HTTP request's state naming the agent its bearer token stands for"""


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
            scope.setdefault("state", {})[AGENT_STATE] = agent_id
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


async def serve_http(server: Server[Any], settings: McpSettings, stop: asyncio.Event) -> None:
    import uvicorn

    class _Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the command owns the signals, so the broker closes before the process exits

    app: Any = server.streamable_http_app(host=settings.host)
    if settings.tokens_file is not None:
        app = BearerAuth(app, Tokens(settings.tokens_file))
    config = uvicorn.Config(  # streamable HTTP, no WebSockets: ws="none" loads no WebSocket library at start
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=5,
        ws="none",
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
