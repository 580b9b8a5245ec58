"""The gateway's HTTP API: a plain ASGI callable over a ``Gateway``.

HTTP API (JSON; the same on TCP and on the Unix socket; every call but ``/healthz`` needs
``Authorization: Bearer TOKEN``):

- ``POST /v1/asks`` ``{request, key?, detachGrace?, timeout?, remember?, coalesce?, wait?, attachments?}``:
  start an ask; with ``wait`` (seconds) the reply waits that long for its outcome. ``attachments``: the
  texts the request's questions name (``attachment``: SHA-256 and size), kept before the question is
  asked, so a face can show what a question shows cut. With ``key``, an ask of the same agent under the
  same key and request is the same ask (re-attach) while it is pending, or answered and its answer not
  yet handed to any caller; once a reply has carried its answer (collected), the key asks anew: one
  answer, one call. After a gateway restart the broker re-attaches to a pending one in Redis.
- ``GET /v1/asks/{id}?wait=S``: its state, waiting up to S seconds for the outcome (long poll); the
  same ask read again by its id, so it may carry an answer already collected.
- ``DELETE /v1/asks/{id}``: withdraw it.
- ``GET /v1/asks``: the calling agent's asks.

A reply is ``{id, agent, state, key?, createdAt, questions, answer?, error?}``: 200 answered, 202
pending, and a failure carries ``error: {name, code, message}`` with the status of its code
(``HTTP_STATUS``). A bad or missing token is 401 ``UNAUTHENTICATED`` whatever the agent or ask;
another agent's ask is 404 ``UNKNOWN_ASK``, like one that never was.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from broker import UserQuestionError
from broker.attachments import MAX_ATTACHMENT_BYTES
from broker.errors import BAD_REQUEST, UNAUTHENTICATED
from workers.asking.gateway.asks import HTTP_STATUS
from workers.asking.gateway.service import Gateway
from workers.asking.gateway.tokens import Tokens, bearer

__all__ = ["build_app"]

_BODY_BYTES: Final = 64 * 1024 + 2 * MAX_ATTACHMENT_BYTES
"""a body's bytes beyond the request's own limit: the few fields around it, and attachments (JSON-escaped)"""

# A plain ASGI callable rather than a Starlette app: five fixed routes need no router, and
# Starlette's layers (its middleware stack, Request, Headers, the body stream, JSONResponse) were
# 0.08-0.15 ms of the gateway's p50 (python -m benchmarks.gateway_ab, trees probed in rotation, four rounds).

_JSON_TYPE: Final = (b"content-type", b"application/json")
_ASK_PATH: Final = "/v1/asks/"
_Handler = Callable[[Scope, Receive, str], Awaitable["tuple[int, Any] | None"]]
"""a route's handler: (scope, receive, the ask id of /v1/asks/{id}) to (status, JSON content), None for no reply"""


async def _send_json(send: Send, status: int, content: Any) -> None:
    body = msgspec.json.encode(content)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [_JSON_TYPE, (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_plain(send: Send, status: int, text: str, *, allow: str | None = None) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body))]
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _query(scope: Scope, name: str) -> str | None:
    found = None
    for key, value in urllib.parse.parse_qsl(bytes(scope["query_string"]).decode("latin-1"), keep_blank_values=True):
        if key == name:
            found = value  # the last one counts, as in Starlette's QueryParams
    return found


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, refused past ``limit`` bytes; None when the client went away first."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise UserQuestionError(f"the body is over {limit} bytes", BAD_REQUEST)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _agent(scope: Scope, tokens: Tokens) -> str:
    agent_id = tokens.agent_for(bearer(_header(scope, b"authorization")))
    if agent_id is None:
        raise UserQuestionError("a valid bearer token is required", UNAUTHENTICATED)
    return agent_id


def _seconds(text: str | None) -> float:
    if text is None:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise UserQuestionError(f"wait must be a number of seconds, not {text!r}", BAD_REQUEST) from None
    if not 0 <= value < float("inf"):
        raise UserQuestionError(f"wait must be a number of seconds, not {text!r}", BAD_REQUEST)
    return value


def build_app(gateway: Gateway, tokens: Tokens) -> ASGIApp:
    """The gateway's HTTP application over ``gateway``, authenticating by ``tokens``."""

    async def create(scope: Scope, receive: Receive, _: str) -> tuple[int, Any] | None:
        agent_id = _agent(scope, tokens)
        # The request's own limit, and room for the few fields and the attachments around it.
        raw = await _body(receive, gateway.broker.limits.max_request_bytes + _BODY_BYTES)
        if raw is None:
            return None
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError as error:
            raise UserQuestionError(f"the body is not JSON: {error}", BAD_REQUEST) from error
        wait = body.get("wait") if isinstance(body, dict) else None
        if wait is not None and (isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0):
            raise UserQuestionError("wait must be a number of seconds", BAD_REQUEST)
        ask = await gateway.ask(agent_id, body)
        await gateway.wait(ask, float(wait or 0))
        return ask.status, ask.view()

    async def listing(scope: Scope, receive: Receive, _: str) -> tuple[int, Any]:
        agent_id = _agent(scope, tokens)
        return 200, {"asks": [ask.view() for ask in gateway.asks_of(agent_id)]}

    async def show(scope: Scope, receive: Receive, ask_id: str) -> tuple[int, Any]:
        agent_id = _agent(scope, tokens)
        seconds = _seconds(_query(scope, "wait"))
        ask = gateway.find(agent_id, ask_id)
        await gateway.wait(ask, seconds)
        return ask.status, ask.view()

    async def withdraw(scope: Scope, receive: Receive, ask_id: str) -> tuple[int, Any]:
        agent_id = _agent(scope, tokens)
        ask = gateway.find(agent_id, ask_id)
        await gateway.withdraw(ask)
        return ask.status, ask.view()

    async def healthz(scope: Scope, receive: Receive, _: str) -> tuple[int, Any]:
        return 200, {"ok": True}

    asks: dict[str, _Handler] = {"POST": create, "GET": listing}
    one_ask: dict[str, _Handler] = {"GET": show, "DELETE": withdraw}
    health: dict[str, _Handler] = {"GET": healthz}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no lifespan (uvicorn runs with it off), no websockets
            return
        path: str = scope["path"]
        ask_id = ""
        if path == "/v1/asks":
            handlers = asks
        elif path.startswith(_ASK_PATH) and len(path) > len(_ASK_PATH) and "/" not in path[len(_ASK_PATH) :]:
            handlers, ask_id = one_ask, path[len(_ASK_PATH) :]
        elif path == "/healthz":
            handlers = health
        else:
            await _send_plain(send, 404, "Not Found")
            return
        method: str = scope["method"]
        handler = handlers.get("GET" if method == "HEAD" else method)
        if handler is None:
            allowed = sorted({*handlers, "HEAD"} if "GET" in handlers else handlers)
            await _send_plain(send, 405, "Method Not Allowed", allow=", ".join(allowed))
            return
        try:
            reply = await handler(scope, receive, ask_id)
        except UserQuestionError as error:
            reply = HTTP_STATUS.get(error.code, 500), {"error": error.to_dict()}
        if reply is not None:  # None: the client went away before its body arrived
            await _send_json(send, *reply)

    return app
