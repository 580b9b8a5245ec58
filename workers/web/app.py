"""The Starlette app: the page, its JSON API under ``/api`` and the change stream.

The app's lifespan opens the broker and runs the ``WebProvider`` lease loop in a task
group it owns, so the lease is released when the server stops.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import Broker, UserQuestionError
from broker.errors import BAD_ANSWER, LEASE_LOST, NOT_PENDING
from broker.types import convert_answer, encode

from .auth import Sessions, SignInThrottle, WebError, check_same_origin, new_csrf_token, unauthenticated
from .config import WebConfig
from .service import WebProvider

__all__ = ["CONTENT_SECURITY_POLICY", "create_app"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_MAX_BODY = 1024 * 1024
_KEEPALIVE_S = 15.0
_STATUS_OF_CODE = {BAD_ANSWER: 422, NOT_PENDING: 409, LEASE_LOST: 503}


class SecurityHeaders:
    """Strict CSP and friends on every response; nothing from ``/api`` is cached."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                    (b"cross-origin-opener-policy", b"same-origin"),
                ]
                if scope["path"].startswith("/api") or scope["path"] == "/":
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _error(error: WebError | UserQuestionError) -> JSONResponse:
    if isinstance(error, WebError):
        return JSONResponse(error.to_dict(), status_code=error.status)
    return JSONResponse(error.to_dict(), status_code=_STATUS_OF_CODE.get(error.code, 400))


async def _json_body(request: Request, *, required: bool = True) -> Any:
    if "application/json" not in request.headers.get("content-type", ""):
        if not required:
            return {}
        raise WebError(415, "BAD_CONTENT_TYPE", "send application/json")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > _MAX_BODY:
            raise WebError(413, "TOO_LARGE", f"request body over {_MAX_BODY} bytes")
    if not body and not required:
        return {}
    try:
        return json.loads(body)
    except ValueError as error:
        raise WebError(400, "BAD_JSON", f"malformed JSON: {error}") from error


def create_app(config: WebConfig) -> Starlette:
    sessions = Sessions(config)
    throttle = SignInThrottle()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not config.credentials:
            log.warning("no users or tokens configured: nobody can sign in")
        async with Broker(config.redis_url, config.namespace, lease_ttl=config.lease_ttl) as broker:
            service = WebProvider(broker, name=config.name)
            app.state.service = service
            async with asyncio.TaskGroup() as tasks:
                serving = tasks.create_task(service.run(), name="qb-web-provider")
                try:
                    yield
                finally:
                    serving.cancel()

    def service_of(request: Request) -> WebProvider:
        service: WebProvider = request.app.state.service
        return service

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def healthz(request: Request) -> Response:
        service = service_of(request)
        return JSONResponse({"status": service.status, "holder": service.holder})

    async def get_session(request: Request) -> Response:
        try:
            identity = sessions.identify(request)
        except WebError as error:
            return _error(error)
        return JSONResponse({"user": identity.user, "csrf": identity.csrf, "namespace": config.namespace})

    async def sign_in(request: Request) -> Response:
        client = request.client.host if request.client else "?"
        try:
            check_same_origin(request)
            throttle.check(client)
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise unauthenticated()
            user: str | None = None
            if isinstance(body.get("token"), str):
                user = config.credentials.token_owner(body["token"])
            elif (
                isinstance(body.get("user"), str)
                and isinstance(body.get("password"), str)
                and config.credentials.check_password(body["user"], body["password"])
            ):
                user = body["user"]
            if user is None:
                throttle.failed(client)
                raise WebError(401, "UNAUTHENTICATED", "wrong user name, password or token")
        except WebError as error:
            return _error(error)
        csrf = new_csrf_token()
        response = JSONResponse({"user": user, "csrf": csrf, "namespace": config.namespace})
        sessions.sign_in(response, user, csrf)
        log.info("%s signed in", user)
        return response

    async def sign_out(request: Request) -> Response:
        try:
            sessions.identify_for_change(request)
        except WebError as error:
            return _error(error)
        response = JSONResponse({})
        sessions.sign_out(response)
        return response

    async def list_requests(request: Request) -> Response:
        try:
            sessions.identify(request)
        except WebError as error:
            return _error(error)
        service = service_of(request)
        return JSONResponse({"status": service.status, "holder": service.holder, "requests": service.requests()})

    async def answer(request: Request) -> Response:
        try:
            identity = sessions.identify_for_change(request)
            body = await _json_body(request)
            try:
                parsed = convert_answer(body)
            except msgspec.ValidationError as error:
                raise UserQuestionError(f"malformed answer: {error}", BAD_ANSWER) from error
            accepted = await service_of(request).answer(request.path_params["id"], parsed, by=identity.user)
        except (WebError, UserQuestionError) as error:
            return _error(error)
        return Response(encode({"ok": True, "by": identity.user, "answer": accepted}), media_type="application/json")

    async def cancel(request: Request) -> Response:
        try:
            identity = sessions.identify_for_change(request)
            body = await _json_body(request, required=False)
            message = body.get("message") if isinstance(body, dict) else None
            if not isinstance(message, str) or not message.strip():
                message = f"{identity.user} dismissed the question"
            await service_of(request).cancel(request.path_params["id"], message[:2000], by=identity.user)
        except (WebError, UserQuestionError) as error:
            return _error(error)
        return JSONResponse({"ok": True, "by": identity.user})

    async def events(request: Request) -> Response:
        try:
            sessions.identify(request)
        except WebError as error:
            return _error(error)
        service = service_of(request)

        async def stream() -> AsyncIterator[str]:
            async with service.subscribe() as queue:
                yield "retry: 1000\n\n"
                while True:
                    try:
                        event = await asyncio.wait_for(queue.get(), _KEEPALIVE_S)
                    except TimeoutError:
                        yield ": keepalive\n\n"
                        continue
                    if event is None:
                        return
                    yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    routes = [
        Route("/", page),
        Route("/healthz", healthz),
        Route("/api/session", get_session, methods=["GET"]),
        Route("/api/session", sign_in, methods=["POST"]),
        Route("/api/session", sign_out, methods=["DELETE"]),
        Route("/api/requests", list_requests, methods=["GET"]),
        Route("/api/requests/{id}/answer", answer, methods=["POST"]),
        Route("/api/requests/{id}/cancel", cancel, methods=["POST"]),
        Route("/api/events", events, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(SecurityHeaders)
    return app
