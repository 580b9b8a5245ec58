"""The Starlette app: the page, its JSON API under ``/api`` and the change stream.

The app's lifespan opens the broker and runs the ``WebProvider`` lease loop in a task
group it owns, so the lease is released when the server stops. Refusals are
``WebError`` / ``UserQuestionError`` raised anywhere in a handler and turned into
``{name, code, message}`` by the exception handlers; anything else becomes a coded 500,
and every response, refusals and crashes included, carries the security headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import Broker, Policies, UserQuestionError
from broker.errors import BROKER_UNAVAILABLE
from workers.answering.web import endpoints
from workers.answering.web.auth import Auth
from workers.answering.web.config import WebConfig
from workers.answering.web.endpoints import STATIC
from workers.answering.web.errors import WebError
from workers.answering.web.keys import WebKeys
from workers.answering.web.service import Event, WebProvider
from workers.answering.web.sessions import SessionStore
from workers.answering.web.stream import events
from workers.answering.web.throttle import Throttle
from workers.answering.web.users import UsersFile, unmet_policies

__all__ = ["CONTENT_SECURITY_POLICY", "create_app"]

log = logging.getLogger(__name__)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_USERS_FILE_EVERY_S = 1.0
"""how often the server looks at its users file besides each request (one stat): an open change stream
of a person removed meanwhile ends within about this long, even while nobody else asks anything"""
_RECHECK: Event = {"type": "keepalive"}
"""put on every open change stream when the users file changed: the stream checks its session at once"""
_STATUS_OF_CODE = {
    "BAD_ANSWER": 422,
    "NOT_PENDING": 409,
    "NOT_STANDING_BY": 409,
    "LEASE_LOST": 503,
    "BROKER_UNAVAILABLE": 503,
    "NOT_APPROVER": 403,
}
_INTERNAL = json.dumps({"name": "WebError", "code": "INTERNAL", "message": "internal error; see the server log"})


def _security_headers(path: str) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"x-frame-options", b"DENY"),
        (b"cross-origin-opener-policy", b"same-origin"),
    ]
    if path.startswith("/api") or path == "/":
        headers.append((b"cache-control", b"no-store"))
    return headers


class SecurityHeaders:
    """Strict CSP and friends on every response; nothing from ``/api`` is cached.

    It also turns a crash into a coded 500 here, inside the headers, rather than leaving
    it to Starlette's outermost error middleware (whose 500 would carry none of them).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), *_security_headers(scope["path"])]
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            log.exception("%s %s failed", scope.get("method"), scope["path"])
            if started:
                raise
            await send_with_headers(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(_INTERNAL))],
                }
            )
            await send({"type": "http.response.body", "body": _INTERNAL.encode()})


async def _on_web_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, WebError)
    return JSONResponse(error.to_dict(), status_code=error.status, headers=error.headers)


async def _on_question_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, UserQuestionError)
    body: dict[str, Any] = error.to_dict()
    winner = getattr(error, "winner", None)
    if winner is not None:
        body["winner"] = winner
    return JSONResponse(body, status_code=_STATUS_OF_CODE.get(error.code, 400))


_REQUEST_REDIS_TIMEOUT = 3.0


def _bounded(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``call`` with a deadline: a request handler answers 503 rather than hang while Redis is away."""

    async def bounded(*args: Any, **options: Any) -> Any:
        try:
            async with asyncio.timeout(_REQUEST_REDIS_TIMEOUT):
                return await call(*args, **options)
        except TimeoutError as error:
            raise UserQuestionError(
                f"Redis did not answer within {_REQUEST_REDIS_TIMEOUT:g}s", BROKER_UNAVAILABLE
            ) from error

    return bounded


def _users_changed(users: UsersFile, policies: Policies, streams: set[asyncio.Queue[Event | None]]) -> None:
    """The users file changed: every open change stream checks its session now, not at its next event."""
    log.info("read the users file %s again", users.path)
    for problem in unmet_policies(policies):
        log.warning("the users file %s changed: %s", users.path, problem)
    for queue in streams:
        with contextlib.suppress(asyncio.QueueFull):  # a full queue has events coming, each checked
            queue.put_nowait(_RECHECK)


async def _watch_users_file(users: UsersFile) -> None:
    """Look at the users file once a second besides at every request, for the open streams' sake.

    There is no portable way to be told of a change to a file, and one stat a second is nothing."""
    while True:
        await asyncio.sleep(_USERS_FILE_EVERY_S)
        users.refresh()


async def _on_redis_down(request: Request, error: Exception) -> Response:
    log.warning("%s %s: Redis unavailable: %s", request.method, request.url.path, error)
    body = {"name": "WebError", "code": "BROKER_UNAVAILABLE", "message": "the broker's Redis is unavailable"}
    return JSONResponse(body, status_code=503, headers={"Retry-After": "2"})


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    """Open a broker and a ``WebProvider`` per namespace, and run them (and the Slack face) until the server stops."""
    config: WebConfig = app.state.config
    if not config.credentials.current():
        log.warning("no users or tokens configured: nobody can sign in")
    streams: set[asyncio.Queue[Event | None]] = set()
    app.state.streams = streams
    users = config.credentials if isinstance(config.credentials, UsersFile) else None
    async with AsyncExitStack() as stack:
        if users is not None:
            stack.callback(users.on_change(lambda _: _users_changed(users, config.policies, streams)))
        services = {namespace: await _provider(config, namespace, stack) for namespace in config.namespaces}
        # Sessions live in the primary namespace. A page request waits for Redis a few seconds
        # at most (then 503), not the broker's whole unavailable_after.
        call = _bounded(services[config.namespace].broker.commands.call)
        keys = WebKeys(config.namespace)
        app.state.services = services
        app.state.auth = Auth(
            config, SessionStore(call, keys, max_age=config.session_max_age), Throttle(call, keys, config.throttle)
        )
        app.state.slack = None
        if config.slack:  # slack-sdk is an optional extra: imported only for a page with a Slack face
            from workers.answering.slack.face import SlackFace

            app.state.slack = SlackFace(config.slack, services, public_url=config.public_url)
        async with asyncio.TaskGroup() as tasks:
            serving = [
                tasks.create_task(service.run(), name=f"qb-web-provider-{namespace}")
                for namespace, service in services.items()
            ]
            if users is not None:
                serving.append(tasks.create_task(_watch_users_file(users), name="qb-web-users-file"))
            if app.state.slack is not None:
                serving.append(tasks.create_task(app.state.slack.run(), name="qb-web-slack"))
                if config.slack and config.slack.socket_mode:
                    serving.append(tasks.create_task(app.state.slack.socket_mode(), name="qb-web-slack-socket"))
            try:
                yield
            finally:
                for task in serving:
                    task.cancel()


async def _provider(config: WebConfig, namespace: str, stack: AsyncExitStack) -> WebProvider:
    """The web provider of one namespace, its broker open until ``stack`` closes."""
    broker = await stack.enter_async_context(
        Broker(
            config.redis_url,
            namespace,
            lease_ttl=config.lease_ttl,
            signing_key=config.signing_key or None,
            gateway_keys=config.gateway_keys,
        )
    )
    return WebProvider(
        broker,
        name=config.name,
        keys=WebKeys(namespace),
        public_url=config.public_url,
        policies=config.policies,
        handover_grace=config.handover_grace,
    )


_ROUTES = [
    Route("/", endpoints.page),
    Route("/healthz", endpoints.healthz),
    Route("/favicon.ico", endpoints.favicon),
    Route("/metrics", endpoints.metrics),
    Route("/api/session", endpoints.get_session, methods=["GET"]),
    Route("/api/session", endpoints.sign_in, methods=["POST"]),
    Route("/api/session", endpoints.sign_out, methods=["DELETE"]),
    Route("/api/requests", endpoints.list_requests, methods=["GET"]),
    Route("/api/history", endpoints.history, methods=["GET"]),
    Route("/api/requests/{id}/answer", endpoints.answer, methods=["POST"]),
    Route("/api/requests/{id}/cancel", endpoints.cancel, methods=["POST"]),
    Route("/api/takeover", endpoints.take_over, methods=["POST"]),
    Route("/api/attachments/{sha256}", endpoints.attachment, methods=["GET"]),
    Route("/api/decisions", endpoints.decisions, methods=["GET"]),
    Route("/api/decisions/{id}/revoke", endpoints.revoke_decision, methods=["POST"]),
    Route("/api/events", events, methods=["GET"]),
    Route("/slack/interactive", endpoints.slack_interactive, methods=["POST"]),
    Mount("/static", StaticFiles(directory=STATIC), name="static"),
]


def create_app(config: WebConfig) -> Starlette:
    app = Starlette(
        routes=_ROUTES,
        lifespan=_lifespan,
        exception_handlers={
            WebError: _on_web_error,
            UserQuestionError: _on_question_error,
            RedisConnectionError: _on_redis_down,
            RedisTimeoutError: _on_redis_down,
        },
    )
    app.state.config = config
    app.add_middleware(SecurityHeaders)
    return app
