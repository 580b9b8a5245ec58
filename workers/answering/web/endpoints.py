"""The JSON API's endpoints (``/api``), the page and the probes: plain functions, each reading the server's
state from ``request.app.state`` (``services``, ``auth``, ``config``, ``slack``), as ``app.create_app`` routes them.

A refusal is raised (``WebError``, ``UserQuestionError``) and answered by the app's exception handlers.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from broker import AskUserQuestionAnswer, Tally, UserQuestionError
from broker.attachments import is_digest
from workers.answering.web.auth import Auth, Identity, check_same_origin
from workers.answering.web.cards import filter_tags
from workers.answering.web.config import WebConfig
from workers.answering.web.errors import WebError
from workers.answering.web.history import read_history, seen_by
from workers.answering.web.metrics import SIGN_INS
from workers.answering.web.remembered import list_remembered, parse_remember, revoke_remembered
from workers.answering.web.service import WebProvider
from workers.inert import inert

if TYPE_CHECKING:
    from workers.answering.slack.face import SlackFace

__all__ = [
    "MAX_BODY",
    "STATIC",
    "answer",
    "attachment",
    "auth_of",
    "cancel",
    "config_of",
    "decisions",
    "favicon",
    "get_session",
    "healthz",
    "history",
    "json_body",
    "list_requests",
    "metrics",
    "page",
    "revoke_decision",
    "services_of",
    "sign_in",
    "sign_out",
    "slack_interactive",
    "take_over",
]

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_BODY = 1024 * 1024


async def _body(request: Request) -> bytes:
    """The request's body, refused (413) once past ``MAX_BODY`` rather than read whole first."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise WebError(413, "TOO_LARGE", f"request body over {MAX_BODY} bytes")
    return bytes(body)


async def json_body(request: Request, *, required: bool = True) -> Any:
    if "application/json" not in request.headers.get("content-type", ""):
        if not required:
            return {}
        raise WebError(415, "BAD_CONTENT_TYPE", "send application/json")
    body = await _body(request)
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


def _voted(tally: Tally, user: str) -> Response:
    """A vote on a card a quorum policy covers: 202 while it waits for more, 200 once it decided."""
    decided = tally.decided
    body: dict[str, Any] = {"ok": True, "by": user, "pending": decided is None, "quorum": tally.view()}
    if decided is not None:
        body.update(by=", ".join(tally.by), answer=decided.answer, remembered=False)
    return Response(msgspec.json.encode(body), status_code=200 if decided else 202, media_type="application/json")


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


def config_of(request: Request) -> WebConfig:
    config: WebConfig = request.app.state.config
    return config


def _session_view(request: Request, identity: Identity) -> dict[str, Any]:
    return {
        "user": identity.user,
        "csrf": identity.csrf,
        "namespace": config_of(request).namespace,
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
        body["namespaces"] = {s.broker.namespace: {"status": s.status, "holder": s.holder} for s in [primary, *others]}
    return JSONResponse(body)


async def get_session(request: Request) -> Response:
    identity = await auth_of(request).identify(request)
    return JSONResponse(_session_view(request, identity))


async def sign_in(request: Request) -> Response:
    auth = auth_of(request)
    check_same_origin(request)
    try:
        body = await json_body(request)
    except WebError:
        await auth.throttle.take_sign_in(None, auth.address(request))  # a malformed try counts too
        raise
    try:
        cookie, record = await auth.sign_in(request, body)
    except WebError as error:
        SIGN_INS.labels(config_of(request).namespace, "throttled" if error.status == 429 else "refused").inc()
        raise
    SIGN_INS.labels(config_of(request).namespace, "ok").inc()
    response = JSONResponse(_session_view(request, auth.identity_of(record)))
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
    truncated = False
    for service in services_of(request, identity):
        # routed as the live page is (docs/approvals.md): what they could not see pending, they do not see now
        seen = functools.partial(
            seen_by, user=identity.user, may_see=service.may_see, sees_every_card=service.sees_every_card(identity.user)
        )
        found, cut_short = await read_history(service.broker, limit=limit, known=service.shown, seen=seen)
        entries += ({**entry, "namespace": service.broker.namespace} for entry in found)
        truncated = truncated or cut_short
    entries.sort(key=lambda entry: entry["atMs"], reverse=True)
    # truncated: a namespace's search stopped at its read bound, so older entries this person may see can exist
    return JSONResponse({"entries": entries[:limit], "truncated": truncated and len(entries) < limit})


async def answer(request: Request) -> Response:
    identity = await auth_of(request).identify_for_change(request)
    body = await json_body(request)
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
    body = await json_body(request, required=False)
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message.strip():
        message = f"{identity.user} dismissed the question"
    tally = await service_for(request, identity).cancel(request.path_params["id"], message[:2000], by=identity.user)
    if tally is not None:
        return _voted(tally, identity.user)
    return JSONResponse({"ok": True, "by": identity.user})


async def take_over(request: Request) -> Response:
    identity = await auth_of(request).identify_for_change(request)
    body = await json_body(request, required=False)
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
    body = await json_body(request, required=False)
    namespace = body.get("namespace") if isinstance(body, dict) else None
    decision_id = request.path_params["id"]
    if not await revoke_remembered(services_of(request, identity), decision_id, by=identity.user,
                                   namespace=namespace):  # fmt: skip
        raise WebError(404, "NOT_FOUND", f"no live remembered decision {decision_id}")
    log.info("%s revoked remembered decision %s", identity.user, decision_id)
    return JSONResponse({"ok": True, "by": identity.user})


async def slack_interactive(request: Request) -> Response:
    """Slack's interactive requests (buttons, modals): signed, checked, answered like the page."""
    face: SlackFace | None = request.app.state.slack
    if face is None:
        raise WebError(404, "NO_SLACK", "this server has no Slack face (--slack-config)")
    status, reply = await face.interact(await _body(request), request.headers)
    return Response(b"" if reply is None else json.dumps(reply).encode(), status_code=status,
                    media_type="application/json")  # fmt: skip
