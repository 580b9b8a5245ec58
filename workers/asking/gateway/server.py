"""The engine of ``qbroker gateway``: agents ask through it holding a bearer token, no Redis credentials.

The gateway is an asker like any other (the asker's Redis user, the providers' public keys: it
verifies every answer before handing it on) that asks on behalf of agents it has authenticated.
A caller's token decides its agent id (``workers.asking.gateway.tokens``); the request's own ``agent``
field may only repeat it. So rules, scopes and pages keyed on agent id see an id no agent chose.

The work is cut by concept: ``asks`` (one ask and its reply), ``agents`` (the agent records held for
them), ``service`` (the ``Gateway`` running them), ``app`` (the HTTP API, documented there), ``listen``
(the sockets) and this module, which serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from broker import Broker, UserQuestionError
from broker.errors import NO_TOKENS
from workers.asking.gateway.app import build_app
from workers.asking.gateway.listen import is_loopback, listen_tcp, listen_unix
from workers.asking.gateway.service import Gateway
from workers.asking.gateway.tokens import Tokens

__all__ = ["GatewaySettings", "check_listening", "serve"]


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    tokens_file: str
    host: str = "127.0.0.1"
    port: int | None = 8790
    """None: no TCP listener (the Unix socket only)"""
    socket_path: str | None = None
    socket_mode: int = 0o600
    keep_for: float = 600.0
    abandon_after: float = 60.0


@contextlib.contextmanager
def _listeners(settings: GatewaySettings) -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    try:
        if settings.port is not None:
            sockets.append(listen_tcp(settings.host, settings.port))
        if settings.socket_path is not None:
            sockets.append(listen_unix(settings.socket_path, settings.socket_mode))
        yield sockets
    finally:
        for sock in sockets:
            sock.close()
        if settings.socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(settings.socket_path)


def check_listening(settings: GatewaySettings, tokens: Tokens) -> None:
    """Refuse a TCP listener beyond loopback while no token exists (``NO_TOKENS``)."""
    if settings.port is not None and not is_loopback(settings.host) and len(tokens) == 0:
        raise UserQuestionError(
            f"refusing to listen on {settings.host}: beyond loopback the gateway needs bearer tokens "
            f"(make one with `qbroker gateway token new AGENT --tokens-file {settings.tokens_file}`)",
            NO_TOKENS,
        )


async def serve(
    settings: GatewaySettings, broker: Broker, stop: asyncio.Event, announce: Callable[[str], None]
) -> None:
    """Serve until ``stop`` is set; the broker must be open. ``announce`` is told each address listened on."""
    import uvicorn

    from workers.asking.gateway.http_protocol import OneWriteHttpToolsProtocol

    tokens = Tokens(settings.tokens_file)
    check_listening(settings, tokens)

    class _Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the command owns the signals, so the asks end before the broker closes

    async with Gateway(broker, keep_for=settings.keep_for, abandon_after=settings.abandon_after) as gateway:
        app = build_app(gateway, tokens)
        config = uvicorn.Config(
            app,
            http=OneWriteHttpToolsProtocol,
            log_config=None,
            lifespan="off",
            ws="none",  # agents speak plain HTTP: no WebSocket library to load at start
            timeout_graceful_shutdown=3,
            server_header=False,
            # Nothing here reads the client's address, and the asks log themselves: neither the
            # forwarded-headers middleware nor an access-log call is worth a step on every request.
            proxy_headers=False,
            access_log=False,
        )
        http = _Uvicorn(config)
        with _listeners(settings) as sockets:
            for sock in sockets:
                if sock.family == socket.AF_UNIX:
                    announce(f"unix:{settings.socket_path}")
                else:
                    host, port = sock.getsockname()[:2]
                    announce(f"http://{f'[{host}]' if ':' in host else host}:{port}")

            async def stop_when_told() -> None:
                await stop.wait()
                http.should_exit = True

            watcher = asyncio.create_task(stop_when_told())
            try:
                await http.serve(sockets=sockets)
            finally:
                watcher.cancel()
