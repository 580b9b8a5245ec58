"""The engine of ``qbroker gateway``: agents ask through it holding a bearer token, no Redis credentials.

The gateway is an asker like any other (the asker's Redis user, the providers' public keys: it
verifies every answer before handing it on) that asks on behalf of agents it has authenticated.
A caller's token decides its agent id (``workers.asking.gateway.tokens``); the request's own ``agent``
field may only repeat it. So rules, scopes and pages keyed on agent id see an id no agent chose.

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

An ask nobody waits on for ``abandon_after`` seconds is withdrawn (its asker went away), or, if
keyed, detached: it stays pending in Redis for its detach grace, for the same key to pick up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import ipaddress
import logging
import os
import secrets
import socket
import stat
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Receive, Scope, Send

from broker import Agent, AskUserQuestionAnswer, AskUserQuestionRequest, Broker, UserQuestionError
from broker.attachments import MAX_ATTACHMENT_BYTES
from broker.errors import (
    BAD_REQUEST,
    BROKER_UNAVAILABLE,
    EMPTY_QUESTIONS,
    NO_TOKENS,
    UNAUTHENTICATED,
    UNKNOWN_ASK,
)
from broker.status import mark_gateway_alive, mark_gateway_gone
from broker.types import convert_request, encode
from broker.validation import check_request
from workers.asking.gateway.tokens import Tokens, bearer

__all__ = ["HTTP_STATUS", "Gateway", "GatewaySettings", "build_app", "is_loopback", "listen_unix", "serve"]

log = logging.getLogger(__name__)

HTTP_STATUS: Final[Mapping[str, int]] = {
    "BAD_REQUEST": 400,
    "EMPTY_QUESTIONS": 400,
    "BAD_INTENT": 400,
    "BAD_ANSWER": 400,
    "UNAUTHENTICATED": 401,
    "DELEGATED_CALLER": 403,
    "UNKNOWN_ASK": 404,
    "CALLER_NOT_LIVE": 409,
    "ASK_CANCELLED": 409,
    "ASK_ABORTED": 409,
    "NOT_PENDING": 409,
    "LEASE_LOST": 409,
    "DUPLICATE_PROVIDER": 409,
    "NO_PROVIDER": 503,
    "BROKER_UNAVAILABLE": 503,
    "ASK_TIMED_OUT": 504,
    "NO_TRUSTED_KEY": 500,
    "NO_SIGNING_KEY": 500,
    "NO_TOKENS": 500,
}
"""the HTTP status of a reply carrying each error code (500 for any other)"""

_MAX_WAIT: Final = 60.0
"""one long poll waits at most this long (proxies cut idle requests); the client polls again"""
_ASK_FIELDS: Final = frozenset(
    {"request", "key", "detachGrace", "timeout", "remember", "coalesce", "wait", "attachments"}
)
_BODY_BYTES: Final = 64 * 1024 + 2 * MAX_ATTACHMENT_BYTES
"""a body's bytes beyond the request's own limit: the few fields around it, and attachments (JSON-escaped)"""


def _attachments(request: AskUserQuestionRequest, given: Any) -> tuple[str, ...]:
    """The texts to keep for ``request``: each one a question names (SHA-256 and size), and no other."""
    if not isinstance(given, list) or not all(isinstance(text, str) for text in given):
        raise UserQuestionError("attachments must be a list of texts", BAD_REQUEST)
    named = {(item.attachment.sha256, item.attachment.size) for item in request.questions if item.attachment}
    for text in given:
        raw = text.encode()
        if (hashlib.sha256(raw).hexdigest(), len(raw)) not in named:
            # An attachment is kept only for a question that shows it: the gateway is no store of its own.
            raise UserQuestionError("an attachment no question of the request names (by SHA-256 and size)", BAD_REQUEST)
    return tuple(given)


def is_loopback(host: str) -> bool:
    """Whether ``host`` listens only to this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _iso(seconds: float) -> str:
    """``seconds`` (Unix time) as ISO 8601 UTC, to the second."""
    return _iso_second(int(seconds))


@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    # Asks made in the same second share the text: strftime was a fiftieth of the gateway's CPU on an ask.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


@dataclass(eq=False)
class GatewayAsk:
    """One ask the gateway runs for an agent."""

    id: str
    agent_id: str
    key: str | None
    digest: str
    """SHA-256 of the request JSON: a keyed re-attach must ask the very same thing ('' unkeyed)"""
    questions: tuple[str, ...]
    created: float = field(default_factory=time.time)
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    answer: AskUserQuestionAnswer | None = None
    error: UserQuestionError | None = None
    task: asyncio.Task[None] | None = None
    watchers: int = 0
    seen: float = 0.0
    """loop time a caller last asked or waited for it"""
    ended: float = 0.0
    collected: bool = False
    """a reply has carried its answer to a caller: its key no longer re-attaches to it"""

    @property
    def state(self) -> str:
        if not self.done.is_set():
            return "pending"
        return "answered" if self.answer is not None else "failed"

    def view(self) -> dict[str, Any]:
        """What a reply says of it; a reply that carries the answer collects it."""
        shown: dict[str, Any] = {
            "id": self.id,
            "agent": self.agent_id,
            "state": self.state,
            "createdAt": _iso(self.created),
            "questions": list(self.questions),
        }
        if self.key is not None:
            shown["key"] = self.key
        if self.answer is not None:
            shown["answer"] = self.answer  # a Struct: the response's encoder writes it in its wire form
            self.collected = True
        if self.error is not None:
            shown["error"] = self.error.to_dict()
        return shown

    @property
    def status(self) -> int:
        if self.error is not None:
            return HTTP_STATUS.get(self.error.code, 500)
        return 200 if self.answer is not None else 202


def _lapsed(ready: asyncio.Future[Agent]) -> bool:
    """A registration that failed, or an instance that is no longer the live one."""
    if not ready.done():
        return False
    return ready.cancelled() or ready.exception() is not None or not ready.result().alive


@dataclass(eq=False)
class _Hold:
    ready: asyncio.Future[Agent]
    release: asyncio.Event
    users: int = 0
    linger: asyncio.TimerHandle | None = None


class _Agents:
    """The live agent records the gateway holds: one per agent id while it has asks running.

    A record outlives its last ask by ``linger`` seconds: an agent asking one question at a time
    would otherwise pay a registration (a round trip) on every ask.
    """

    def __init__(self, broker: Broker, tasks: asyncio.TaskGroup, linger: float) -> None:
        self._broker = broker
        self._tasks = tasks
        self._linger = linger
        self._held: dict[str, _Hold] = {}
        self._holding: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def use(self, agent_id: str) -> AsyncIterator[Agent]:
        hold = self._held.get(agent_id)
        if hold is None or _lapsed(hold.ready):
            # Registered anew: a direct asker taking the id over makes the old record not live.
            hold = _Hold(asyncio.get_running_loop().create_future(), asyncio.Event())
            self._held[agent_id] = hold
            task = self._tasks.create_task(self._hold(agent_id, hold), name=f"qb-gateway-agent-{agent_id}")
            self._holding.add(task)
            task.add_done_callback(self._holding.discard)
        if hold.linger is not None:
            hold.linger.cancel()
            hold.linger = None
        hold.users += 1
        try:
            yield await asyncio.shield(hold.ready)
        finally:
            hold.users -= 1
            if hold.users == 0:
                hold.linger = asyncio.get_running_loop().call_later(self._linger, self._let_go, agent_id, hold)

    def _let_go(self, agent_id: str, hold: _Hold) -> None:
        hold.linger = None
        hold.release.set()
        if self._held.get(agent_id) is hold:
            del self._held[agent_id]

    async def _hold(self, agent_id: str, hold: _Hold) -> None:
        try:
            async with self._broker.agent(agent_id) as agent:
                hold.ready.set_result(agent)
                await hold.release.wait()
        except Exception as error:  # handed to the asks waiting for the registration
            if not hold.ready.done():
                hold.ready.set_exception(error)
            else:
                log.warning("agent %s ended: %r", agent_id, error)
        finally:
            if not hold.ready.done():
                hold.ready.cancel()

    def release_all(self) -> None:
        for hold in self._held.values():
            if hold.linger is not None:
                hold.linger.cancel()
            hold.release.set()

    def abandon_all(self) -> None:
        """Stop removing records (Redis does not answer): each expires with its TTL."""
        for task in self._holding:
            task.cancel()


class Gateway:
    """The asks of authenticated agents, run through one broker; an async context manager."""

    def __init__(
        self,
        broker: Broker,
        *,
        keep_for: float = 600.0,
        abandon_after: float = 60.0,
        max_asks: int = 100,
        agent_linger: float = 10.0,
        stop_grace: float = 2.0,
        name: str = "",
        beat_every: float = 5.0,
    ) -> None:
        self.broker = broker
        self.name = name or f"gateway@{socket.gethostname()}:{os.getpid()}"
        """how ``qbroker status`` lists this gateway while it beats"""
        self.beat_every = beat_every
        self.stop_grace = stop_grace
        """stopping, how long the asks' withdrawals and the agents' removals may wait for Redis"""
        self.keep_for = keep_for
        """how long a finished ask's outcome stays readable"""
        self.abandon_after = abandon_after
        self.max_asks = max_asks
        """asks one agent may have pending at once"""
        self.agent_linger = agent_linger
        """how long an agent's record stays registered after its last ask ended"""
        self._asks: dict[str, GatewayAsk] = {}
        self._by_agent: dict[str, dict[str, GatewayAsk]] = {}
        """the same asks by agent: finding an agent's own costs its asks, not every agent's"""
        self._pending: dict[str, int] = {}
        """each agent's asks not yet ended (counting them ask by ask cost an agent's whole history)"""
        self._stack = contextlib.AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None
        self._agents: _Agents | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Gateway:
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._agents = _Agents(self.broker, self._tasks, self.agent_linger)
        self._stack.callback(self._stop)
        self._sweeper = self._tasks.create_task(self._sweep(), name="qb-gateway-sweep")
        beating = self._tasks.create_task(self._beat(), name="qb-gateway-beat")
        self._stack.push_async_callback(self._leave, beating)  # first out: before the asks are let go
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    async def _beat(self) -> None:
        """Say in Redis that this gateway runs (``qbroker status``); missed beats only make it look gone."""
        while True:
            try:
                await mark_gateway_alive(self.broker, self.name, ttl=3 * self.beat_every)
            except (UserQuestionError, RedisError, OSError) as error:
                log.debug("gateway beat not taken: %s", error)
            await asyncio.sleep(self.beat_every)

    async def _leave(self, beating: asyncio.Task[None]) -> None:
        beating.cancel()
        # Briefly: with Redis gone the entry lapses with its beat, and stopping must not wait on it.
        with contextlib.suppress(UserQuestionError, RedisError, OSError, TimeoutError):
            async with asyncio.timeout(0.5):
                await mark_gateway_gone(self.broker, self.name)

    def _stop(self) -> None:
        assert self._tasks is not None and self._agents is not None
        for ask in self._asks.values():
            if ask.task is not None:
                ask.task.cancel()  # a keyed ask detaches, the others are withdrawn (the broker's rule)
        self._agents.release_all()
        if self._sweeper is not None:
            self._sweeper.cancel()
        asyncio.get_running_loop().call_later(self.stop_grace, self._abandon)

    def _abandon(self) -> None:
        """Stopping, and Redis has not taken the asks' ends within ``stop_grace``: stop waiting for it.

        Cancelled again, an ask leaves its withdrawal to the broker, whose close gives it a last few
        seconds; past those an unkeyed question is reaped once this process's liveness lapses, a keyed one
        waits out its grace. So a SIGTERM ends the gateway in seconds even with Redis gone.
        """
        assert self._agents is not None
        for ask in self._asks.values():
            if ask.task is not None and not ask.task.done():
                ask.task.cancel()
        self._agents.abandon_all()

    # -- operations ---------------------------------------------------------------------

    async def ask(self, agent_id: str, body: Any) -> GatewayAsk:
        """Start (or, keyed, re-attach to) an ask of ``agent_id``; ``body`` is the decoded JSON."""
        if self._tasks is None or self._agents is None:
            raise UserQuestionError("the gateway is not running", BROKER_UNAVAILABLE)
        if not isinstance(body, dict):
            raise UserQuestionError("the body must be a JSON object", BAD_REQUEST)
        unknown = set(body) - _ASK_FIELDS
        if unknown:
            raise UserQuestionError(f"unknown fields: {', '.join(sorted(unknown))}", BAD_REQUEST)
        try:
            request = convert_request(body.get("request"))
        except msgspec.ValidationError as error:
            raise UserQuestionError(f"the request is not valid: {error}", BAD_REQUEST) from error
        if request.agent is not None and request.agent != agent_id:
            # The token decides who asks: naming another agent is refused, not silently replaced.
            raise UserQuestionError("the request names another agent than its token's", BAD_REQUEST)
        request = msgspec.structs.replace(request, agent=agent_id)
        if not request.questions:
            raise UserQuestionError("the request has no questions", EMPTY_QUESTIONS)
        check_request(request, self.broker.limits)  # bad input fails the call itself, not a started ask
        key = body.get("key")
        if key is not None and not isinstance(key, str):
            raise UserQuestionError("key must be a string", BAD_REQUEST)
        options = {name: body.get(name) for name in ("detachGrace", "timeout")}
        for name, value in options.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
                raise UserQuestionError(f"{name} must be a number of seconds", BAD_REQUEST)
        remember, coalesce = body.get("remember", True), body.get("coalesce", True)
        if not isinstance(remember, bool) or not isinstance(coalesce, bool):
            raise UserQuestionError("remember and coalesce must be true or false", BAD_REQUEST)
        if options["detachGrace"] is not None and key is None:
            raise UserQuestionError("detachGrace applies to a keyed ask only: give key too", BAD_REQUEST)
        attachments = _attachments(request, body.get("attachments", []))
        # Only a keyed re-attach compares requests; an unkeyed ask leaves the encoding to the broker.
        digest = hashlib.sha256(encode(request)).hexdigest() if key is not None else ""
        now = asyncio.get_running_loop().time()
        mine = self._by_agent.get(agent_id, {}).values()
        if key is not None:
            for ask in mine:
                # An answer handed to a caller answered that call: the same key is a new question now.
                if ask.key != key or ask.collected or (ask.done.is_set() and ask.answer is None):
                    continue
                if ask.digest != digest:
                    raise UserQuestionError(f"key {key!r} names another question of this agent", BAD_REQUEST)
                ask.seen = now
                return ask
        if self._pending.get(agent_id, 0) >= self.max_asks:
            raise UserQuestionError(f"this agent has {self.max_asks} asks pending already", BAD_REQUEST)
        ask = GatewayAsk(
            id=secrets.token_urlsafe(16),
            agent_id=agent_id,
            key=key,
            digest=digest,
            questions=tuple(item.id for item in request.questions),
            seen=now,
        )
        self._asks[ask.id] = ask
        self._by_agent.setdefault(agent_id, {})[ask.id] = ask
        self._pending[agent_id] = self._pending.get(agent_id, 0) + 1
        ask.task = self._tasks.create_task(
            self._run(ask, request, options["timeout"], options["detachGrace"], remember, coalesce, attachments),
            name="qb-gateway-ask",
        )
        return ask

    def find(self, agent_id: str, ask_id: str) -> GatewayAsk:
        ask = self._asks.get(ask_id)
        if ask is None or ask.agent_id != agent_id:
            raise UserQuestionError("no ask of this agent has that id", UNKNOWN_ASK)
        return ask

    def asks_of(self, agent_id: str) -> list[GatewayAsk]:
        return sorted(self._by_agent.get(agent_id, {}).values(), key=lambda ask: ask.created)

    async def wait(self, ask: GatewayAsk, seconds: float) -> None:
        """Wait up to ``seconds`` for the ask's outcome (never cancels it)."""
        loop = asyncio.get_running_loop()
        ask.watchers += 1
        try:
            if seconds > 0 and not ask.done.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(seconds, _MAX_WAIT)):
                        await ask.done.wait()
        finally:
            ask.watchers -= 1
            ask.seen = loop.time()

    async def withdraw(self, ask: GatewayAsk) -> None:
        ask.abort.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await ask.done.wait()

    # -- the work -----------------------------------------------------------------------

    async def _run(
        self,
        ask: GatewayAsk,
        request: AskUserQuestionRequest,
        timeout: float | None,
        grace: float | None,
        remember: bool,
        coalesce: bool,
        attachments: tuple[str, ...] = (),
    ) -> None:
        assert self._agents is not None
        try:
            async with self._agents.use(ask.agent_id) as agent:
                await asyncio.gather(*(agent.attach(text) for text in attachments))
                ask.answer = await agent.ask(
                    request,
                    abort=ask.abort,
                    timeout=timeout,
                    key=ask.key,
                    detach_grace=grace,
                    remember=remember,
                    coalesce=coalesce,
                )
        except UserQuestionError as error:
            ask.error = error
        except asyncio.CancelledError:
            ask.error = UserQuestionError("the gateway let the ask go", BROKER_UNAVAILABLE)
            raise
        except (RedisError, OSError) as error:
            ask.error = UserQuestionError(f"Redis is unavailable: {error}", BROKER_UNAVAILABLE)
        except Exception as error:  # one ask never takes the gateway down
            log.exception("ask %s failed", ask.id)
            ask.error = UserQuestionError(f"the ask failed: {error!r}", BROKER_UNAVAILABLE)
        finally:
            ask.ended = asyncio.get_running_loop().time()
            ask.done.set()
            left = self._pending[ask.agent_id] - 1
            if left:
                self._pending[ask.agent_id] = left
            else:
                del self._pending[ask.agent_id]
            log.info("ask %s of agent %s: %s", ask.id, ask.agent_id, ask.error.code if ask.error else "answered")

    def _forget(self, ask: GatewayAsk) -> None:
        del self._asks[ask.id]
        mine = self._by_agent[ask.agent_id]
        del mine[ask.id]
        if not mine:
            del self._by_agent[ask.agent_id]

    async def _sweep(self) -> None:
        """Let go of asks nobody waits on, and forget finished ones past ``keep_for``."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.05, min(self.abandon_after, self.keep_for) / 4))
            now = loop.time()
            for ask in list(self._asks.values()):
                if ask.done.is_set():
                    if now - ask.ended > self.keep_for:
                        self._forget(ask)
                elif ask.watchers == 0 and now - ask.seen > self.abandon_after:
                    log.info("ask %s of agent %s: nobody waits on it; letting it go", ask.id, ask.agent_id)
                    if ask.key is not None and ask.task is not None:
                        ask.task.cancel()  # detached: pending in Redis for its grace, for the key to pick up
                        self._forget(ask)
                    else:
                        ask.abort.set()


# -- HTTP -------------------------------------------------------------------------------
#
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


# -- serving ------------------------------------------------------------------------------


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


def listen_unix(path: str, mode: int) -> socket.socket:
    """A listening Unix socket at ``path`` that only ``mode`` may connect to (never wider, not even briefly)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise UserQuestionError(f"{path} exists and is not a socket: not replacing it", BAD_REQUEST)
        os.unlink(path)  # a previous gateway's socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777)  # bound with no permission at all, then opened to ``mode`` exactly
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _listen_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family)
    # Named TCP: asyncio turns Nagle off (TCP_NODELAY) only on accepted sockets whose protocol says so,
    # and create_server leaves it 0; with Nagle on, a reply on a kept-alive connection waited 40 ms
    # for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=listener.detach())
    sock.setblocking(False)
    return sock


@contextlib.contextmanager
def _listeners(settings: GatewaySettings) -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    try:
        if settings.port is not None:
            sockets.append(_listen_tcp(settings.host, settings.port))
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
