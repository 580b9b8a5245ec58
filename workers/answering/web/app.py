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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import AskUserQuestionAnswer, Broker, Policies, Tally, UserQuestionError
from broker.attachments import is_digest
from broker.errors import BROKER_UNAVAILABLE
from workers.answering.web.auth import Auth, Identity, check_same_origin
from workers.answering.web.config import WebConfig
from workers.answering.web.errors import WebError
from workers.answering.web.history import read_history
from workers.answering.web.keys import WebKeys
from workers.answering.web.metrics import SIGN_INS
from workers.answering.web.remembered import list_remembered, parse_remember, revoke_remembered
from workers.answering.web.service import QUEUE_SIZE, Event, WebProvider, filter_tags
from workers.answering.web.sessions import SessionStore
from workers.answering.web.throttle import Throttle
from workers.answering.web.users import UsersFile, unmet_policies
from workers.answering.web.window import PageWindow
from workers.inert import inert

if TYPE_CHECKING:
    from workers.answering.slack.face import SlackFace

__all__ = ["CONTENT_SECURITY_POLICY", "create_app"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_MAX_BODY = 1024 * 1024
_KEEPALIVE_S = 15.0
_SESSION_CHECK_S = 1.0
"""how long the change stream waits for Redis to confirm the session before each event"""
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


def _voted(tally: Tally, user: str) -> Response:
    """A vote on a card a quorum policy covers: 202 while it waits for more, 200 once it decided."""
    decided = tally.decided
    body: dict[str, Any] = {"ok": True, "by": user, "pending": decided is None, "quorum": tally.view()}
    if decided is not None:
        body.update(by=", ".join(tally.by), answer=decided.answer, remembered=False)
    return Response(msgspec.json.encode(body), status_code=200 if decided else 202, media_type="application/json")


def _routed(event: Event, services: dict[str, WebProvider], user: str) -> Event | None:
    """The event as ``user`` may see it: cards routed to a group they are not in are left out."""
    service = services.get(event.get("namespace") or (event.get("request") or {}).get("namespace", ""))
    if service is None or event.get("type") in ("status", "keepalive", "stopping"):
        return event
    if event.get("type") in ("snapshot", "addedMany"):
        views = [view for view in event["requests"] if service.may_see(view, user)]
        if event["type"] == "addedMany" and not views:
            return None
        return {**event, "requests": views}
    return event if service.may_see(event, user) else None


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
    except RecursionError:
        raise WebError(400, "BAD_JSON", "JSON nested too deeply") from None
    except ValueError as error:
        raise WebError(400, "BAD_JSON", f"malformed JSON: {error}") from error


_PAGE_PARAMS = frozenset(("limit", "after", "agent", "priority", "intent", "namespace"))
"""any of these pages ``GET /api/requests``; without them it lists everything, as it always did"""
_PAGE_DEFAULT, _PAGE_MAX = 100, 1000


def _requests_page(params: Mapping[str, str], mine: list[WebProvider], user: str) -> dict[str, Any]:
    """One page of the pending requests of ``mine`` (namespace after namespace, each in the order shown)
    that ``user`` may see and the filters keep, the cursor of the next page (``next``, None at the end)
    and the cursor after the last one returned (``cursor``: never None; what arrives later comes after it).

    The cursor is ``<namespace index>.<sequence>``: opaque to clients, stable while requests come and go."""
    try:
        limit = int(params.get("limit", _PAGE_DEFAULT))
        where, _, seq = (params.get("after") or "0.0").partition(".")
        start, after = int(where), int(seq or "0")
    except ValueError:
        raise WebError(400, "BAD_REQUEST", "limit is a number and after a cursor from a previous page") from None
    if not 1 <= limit <= _PAGE_MAX or start < 0 or after < 0:
        raise WebError(400, "BAD_REQUEST", f"limit is 1 to {_PAGE_MAX}; after a cursor from a previous page")
    agent, priority, intent = params.get("agent"), params.get("priority"), params.get("intent")

    def wanted(service: WebProvider) -> Callable[[dict[str, Any]], bool]:
        def keep(view: dict[str, Any]) -> bool:
            if agent is not None and view["agent"] != agent and all(a["agent"] != agent for a in view["askers"]):
                return False
            if priority is not None and view["priority"] != priority:
                return False
            if intent is not None:
                kinds = {"plan-review" if q.get("planReview") else "none" for q in view["questions"]}
                if intent not in kinds:
                    return False
            return service.may_see(view, user)  # routing (docs/approvals.md)

        return keep

    views: list[dict[str, Any]] = []
    cursor = f"{start}.{after}"
    among = filter_tags(agent=agent, priority=priority, intent=intent)  # a filtered page walks only its cards
    for index in range(start, len(mine)):
        found, last = mine[index].page(after if index == start else 0, limit - len(views), wanted(mine[index]), among)
        views += found
        if found:
            cursor = f"{index}.{mine[index].seq_of(found[-1]['id'])}"
        if last is not None:
            return {"requests": views, "next": f"{index}.{last}", "cursor": cursor}
        if len(views) == limit and index + 1 < len(mine):
            return {"requests": views, "next": f"{index + 1}.0", "cursor": cursor}
    return {"requests": views, "next": None, "cursor": cursor}


def create_app(config: WebConfig) -> Starlette:
    keys = WebKeys(config.namespace)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if not config.credentials.current():
            log.warning("no users or tokens configured: nobody can sign in")
        streams: set[asyncio.Queue[Event | None]] = set()
        app.state.streams = streams
        users = config.credentials if isinstance(config.credentials, UsersFile) else None
        async with AsyncExitStack() as stack:
            if users is not None:
                stack.callback(users.on_change(lambda _: _users_changed(users, config.policies, streams)))
            services: dict[str, WebProvider] = {}
            for namespace in config.namespaces:
                broker = await stack.enter_async_context(
                    Broker(
                        config.redis_url,
                        namespace,
                        lease_ttl=config.lease_ttl,
                        signing_key=config.signing_key or None,
                        gateway_keys=config.gateway_keys,
                    )
                )
                services[namespace] = WebProvider(
                    broker,
                    name=config.name,
                    keys=WebKeys(namespace),
                    public_url=config.public_url,
                    policies=config.policies,
                    handover_grace=config.handover_grace,
                )
            # Sessions live in the primary namespace. A page request waits for Redis a few seconds
            # at most (then 503), not the broker's whole unavailable_after.
            call = _bounded(services[config.namespace].broker.commands.call)
            app.state.services = services
            app.state.auth = Auth(
                config,
                SessionStore(call, keys, max_age=config.session_max_age),
                Throttle(call, keys, config.throttle),
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

    def services_of(request: Request, identity: Identity | None = None) -> list[WebProvider]:
        """The providers of the namespaces served here (that ``identity`` may use), primary first."""
        services: dict[str, WebProvider] = request.app.state.services
        if identity is None:
            return list(services.values())
        return [services[namespace] for namespace in identity.namespaces]

    def service_for(request: Request, identity: Identity) -> WebProvider:
        """The provider that knows the request in the path, among those the caller may use."""
        mine = services_of(request, identity)
        if not mine:
            raise WebError(403, "NO_NAMESPACE", f"{identity.user} may not answer in any namespace served here")
        request_id = request.path_params["id"]
        return next((service for service in mine if service.knows(request_id)), mine[0])

    def auth_of(request: Request) -> Auth:
        auth: Auth = request.app.state.auth
        return auth

    def session_view(identity: Identity) -> dict[str, Any]:
        return {
            "user": identity.user,
            "csrf": identity.csrf,
            "namespace": config.namespace,
            "namespaces": list(identity.namespaces),
        }

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def favicon(request: Request) -> Response:
        # Browsers ask for /favicon.ico whatever the page links; answer rather than log a 404 each time.
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    async def metrics(request: Request) -> Response:
        await auth_of(request).identify(request)  # a bearer token for Prometheus (bearer_token_file)
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        primary, *others = services_of(request)
        body: dict[str, Any] = {
            "status": primary.status,
            "holder": primary.holder,
            "redis": "ok" if primary.redis_ok else "down",
            "redisRun": await primary.redis_run(),
        }
        if others:
            body["namespaces"] = {
                s.broker.namespace: {"status": s.status, "holder": s.holder} for s in [primary, *others]
            }
        return JSONResponse(body)

    async def get_session(request: Request) -> Response:
        identity = await auth_of(request).identify(request)
        return JSONResponse(session_view(identity))

    async def sign_in(request: Request) -> Response:
        auth = auth_of(request)
        check_same_origin(request)
        try:
            body = await _json_body(request)
        except WebError:
            await auth.throttle.take_sign_in(None, auth.address(request))  # a malformed try counts too
            raise
        try:
            cookie, record = await auth.sign_in(request, body)
        except WebError as error:
            SIGN_INS.labels(config.namespace, "throttled" if error.status == 429 else "refused").inc()
            raise
        SIGN_INS.labels(config.namespace, "ok").inc()
        response = JSONResponse(session_view(auth.identity_of(record)))
        auth.set_cookie(response, cookie)
        log.info("%s signed in from %s", record.user, record.address)
        return response

    async def sign_out(request: Request) -> Response:
        auth = auth_of(request)
        await auth.identify_for_change(request)
        await auth.sign_out(request)
        response = JSONResponse({})
        auth.clear_cookie(response)
        return response

    async def list_requests(request: Request) -> Response:
        identity = await auth_of(request).identify(request)
        mine = services_of(request, identity)
        first = mine[0].status_event() if mine else {}
        if _PAGE_PARAMS & request.query_params.keys():
            wanted = request.query_params.get("namespace")
            if wanted is not None:  # one namespace's pages (a page's "more"): cursors count from it
                mine = [service for service in mine if service.broker.namespace == wanted]
                if not mine:
                    raise WebError(403, "NO_NAMESPACE", f"{identity.user} may not answer in namespace {wanted!r} here")
                first = mine[0].status_event()
            return JSONResponse({**first, **_requests_page(request.query_params, mine, identity.user)})
        return JSONResponse(
            {
                **first,  # the first namespace's status, as a single-namespace server always said
                "namespaces": {s.broker.namespace: s.status_event() for s in mine},
                "requests": [
                    view
                    for service in mine
                    for view in service.requests()
                    if service.may_see(view, identity.user)  # routing (docs/approvals.md)
                ],
            }
        )

    async def history(request: Request) -> Response:
        identity = await auth_of(request).identify(request)
        try:
            limit = min(200, max(1, int(request.query_params.get("limit", "50"))))
        except ValueError:
            raise WebError(400, "BAD_REQUEST", "limit is a number") from None
        entries: list[dict[str, Any]] = []
        for service in services_of(request, identity):
            for entry in await read_history(service.broker, limit=limit, known=service.shown):
                entries.append({**entry, "namespace": service.broker.namespace})
        entries.sort(key=lambda entry: entry["atMs"], reverse=True)
        return JSONResponse({"entries": entries[:limit]})

    async def answer(request: Request) -> Response:
        identity = await auth_of(request).identify_for_change(request)
        body = await _json_body(request)
        try:
            parsed = msgspec.convert(body, AskUserQuestionAnswer)
        except msgspec.ValidationError as error:
            raise UserQuestionError(f"malformed answer: {error}", "BAD_ANSWER") from error
        remember = parse_remember(body)
        service = service_for(request, identity)
        accepted = await service.answer(request.path_params["id"], parsed, by=identity.user, remember=remember)
        if isinstance(accepted, Tally):
            return _voted(accepted, identity.user)
        content = msgspec.json.encode(
            {"ok": True, "by": identity.user, "answer": accepted, "remembered": remember is not None}
        )
        return Response(content, media_type="application/json")

    async def cancel(request: Request) -> Response:
        identity = await auth_of(request).identify_for_change(request)
        body = await _json_body(request, required=False)
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message.strip():
            message = f"{identity.user} dismissed the question"
        tally = await service_for(request, identity).cancel(request.path_params["id"], message[:2000], by=identity.user)
        if tally is not None:
            return _voted(tally, identity.user)
        return JSONResponse({"ok": True, "by": identity.user})

    async def take_over(request: Request) -> Response:
        identity = await auth_of(request).identify_for_change(request)
        body = await _json_body(request, required=False)
        mine = services_of(request, identity)
        wanted = body.get("namespace") if isinstance(body, dict) else None
        service = next((s for s in mine if not wanted or s.broker.namespace == wanted), None)
        if service is None:
            raise WebError(403, "NO_NAMESPACE", f"{identity.user} may not answer in namespace {wanted!r} here")
        await service.take_over(by=identity.user)
        return JSONResponse({"ok": True, "by": identity.user, "holder": service.holder})

    async def attachment(request: Request) -> Response:
        """A text a question names by its SHA-256, read from a namespace the user may use and checked against it."""
        identity = await auth_of(request).identify(request)
        digest = request.path_params["sha256"]
        if not is_digest(digest):
            raise WebError(400, "BAD_REQUEST", "an attachment is named by its SHA-256: 64 lowercase hex digits")
        for service in services_of(request, identity):
            text = await service.broker.attachment(digest)
            if text is not None:
                # size: of the bytes the digest names; text: as a page shows it (workers.inert)
                return JSONResponse({"sha256": digest, "size": len(text.encode()), "text": inert(text)})
        raise WebError(404, "NOT_FOUND", "no such attachment (it expires with its question)")

    async def decisions(request: Request) -> Response:
        identity = await auth_of(request).identify(request)
        return JSONResponse(await list_remembered(services_of(request, identity)))

    async def revoke_decision(request: Request) -> Response:
        identity = await auth_of(request).identify_for_change(request)
        body = await _json_body(request, required=False)
        namespace = body.get("namespace") if isinstance(body, dict) else None
        decision_id = request.path_params["id"]
        if not await revoke_remembered(services_of(request, identity), decision_id, by=identity.user,
                                       namespace=namespace):  # fmt: skip
            raise WebError(404, "NOT_FOUND", f"no live remembered decision {decision_id}")
        log.info("%s revoked remembered decision %s", identity.user, decision_id)
        return JSONResponse({"ok": True, "by": identity.user})

    async def events(request: Request) -> Response:
        auth = auth_of(request)
        identity = await auth.identify(request)
        mine = services_of(request, identity)
        streams: set[asyncio.Queue[Event | None]] = request.app.state.streams

        async def still_signed_in() -> bool:
            # While Redis is away it cannot tell, and nothing new is delivered meanwhile: the stream
            # goes on and carries the outage to the page (ending it would read as "the server is
            # gone"), and the session is checked again with the next event once Redis answers.
            if not all(service.redis_ok for service in mine):
                return True
            try:
                async with asyncio.timeout(_SESSION_CHECK_S):
                    now = await auth.identify(request)
            except WebError:
                return False  # signed out, revoked, expired or removed meanwhile: the stream ends
            except (RedisConnectionError, RedisTimeoutError, UserQuestionError, TimeoutError):
                return True
            # A token has no session to end: its stream ends when where it may answer changed, so
            # that the client opens one for the namespaces of now.
            return now.namespaces == identity.namespaces

        async def stream() -> AsyncIterator[str]:
            queue: asyncio.Queue[Event | None] = asyncio.Queue(QUEUE_SIZE * max(1, len(mine)))
            by_namespace = {service.broker.namespace: service for service in mine}
            window = PageWindow(config.page_window)
            async with AsyncExitStack() as subscriptions:
                for service in mine:  # one queue for all: every event names its namespace
                    await subscriptions.enter_async_context(
                        service.subscribe(queue, user=identity.user, window=config.page_window)
                    )
                streams.add(queue)
                subscriptions.callback(streams.discard, queue)
                yield "retry: 1000\n\n"
                while True:
                    try:
                        event = await asyncio.wait_for(queue.get(), _KEEPALIVE_S)
                    except TimeoutError:
                        event = {"type": "keepalive"}
                    if event is None:
                        return
                    event = _routed(event, by_namespace, identity.user)
                    if event is None:
                        continue
                    namespace = event.get("namespace") or (event.get("request") or {}).get("namespace", "")
                    if namespace in by_namespace:
                        service = by_namespace[namespace]
                        event = window.pass_on(event, service.visible_count(identity.user), service.seq_of)
                    # A status event carries no question: it goes out without a session check, so
                    # an outage is shown at once, not after the check's own wait for Redis; so does
                    # the server's goodbye, which must go out before the server does.
                    if event["type"] not in ("status", "stopping") and not await still_signed_in():
                        return
                    if event["type"] == "keepalive":
                        yield ": keepalive\n\n"
                    else:
                        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})

    async def slack_interactive(request: Request) -> Response:
        """Slack's interactive requests (buttons, modals): signed, checked, answered like the page."""
        face: SlackFace | None = request.app.state.slack
        if face is None:
            raise WebError(404, "NO_SLACK", "this server has no Slack face (--slack-config)")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_BODY:
                raise WebError(413, "TOO_LARGE", f"request body over {_MAX_BODY} bytes")
        status, reply = await face.interact(bytes(body), request.headers)
        return Response(b"" if reply is None else json.dumps(reply).encode(), status_code=status,
                        media_type="application/json")  # fmt: skip

    routes = [
        Route("/", page),
        Route("/healthz", healthz),
        Route("/favicon.ico", favicon),
        Route("/metrics", metrics),
        Route("/api/session", get_session, methods=["GET"]),
        Route("/api/session", sign_in, methods=["POST"]),
        Route("/api/session", sign_out, methods=["DELETE"]),
        Route("/api/requests", list_requests, methods=["GET"]),
        Route("/api/history", history, methods=["GET"]),
        Route("/api/requests/{id}/answer", answer, methods=["POST"]),
        Route("/api/requests/{id}/cancel", cancel, methods=["POST"]),
        Route("/api/takeover", take_over, methods=["POST"]),
        Route("/api/attachments/{sha256}", attachment, methods=["GET"]),
        Route("/api/decisions", decisions, methods=["GET"]),
        Route("/api/decisions/{id}/revoke", revoke_decision, methods=["POST"]),
        Route("/api/events", events, methods=["GET"]),
        Route("/slack/interactive", slack_interactive, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            WebError: _on_web_error,
            UserQuestionError: _on_question_error,
            RedisConnectionError: _on_redis_down,
            RedisTimeoutError: _on_redis_down,
        },
    )
    app.add_middleware(SecurityHeaders)
    return app
