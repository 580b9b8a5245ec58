"""The gateway's asks: started, re-attached by key, waited on, withdrawn, and let go when nobody waits.

An ask nobody waits on for ``abandon_after`` seconds is withdrawn (its asker went away), or, if
keyed, detached: it stays pending in Redis for its detach grace, for the same key to pick up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import socket
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

import msgspec
from redis.exceptions import RedisError

from broker import AskUserQuestionRequest, Broker, UserQuestionError
from broker.errors import BAD_REQUEST, BROKER_UNAVAILABLE, EMPTY_QUESTIONS, UNKNOWN_ASK
from broker.operating.status import mark_gateway_alive, mark_gateway_gone
from broker.types import convert_request, encode
from broker.validation import check_request
from workers.asking.gateway.agents import AgentRecords
from workers.asking.gateway.asks import GatewayAsk, checked_attachments

__all__ = ["Gateway"]

log = logging.getLogger(__name__)

_MAX_WAIT: Final = 60.0
"""one long poll waits at most this long (proxies cut idle requests); the client polls again"""
_ASK_FIELDS: Final = frozenset(
    {"request", "key", "detachGrace", "timeout", "remember", "coalesce", "wait", "attachments"}
)


@dataclass(eq=False, repr=False)
class Gateway:
    """The asks of authenticated agents, run through one broker; an async context manager."""

    broker: Broker
    _: KW_ONLY
    keep_for: float = 600.0
    """how long a finished ask's outcome stays readable"""
    abandon_after: float = 60.0
    max_asks: int = 100
    """asks one agent may have pending at once"""
    agent_linger: float = 10.0
    """how long an agent's record stays registered after its last ask ended"""
    stop_grace: float = 2.0
    """stopping, how long the asks' withdrawals and the agents' removals may wait for Redis"""
    name: str = ""
    """how ``qbroker status`` lists this gateway while it beats (by default ``gateway@<host>:<pid>``)"""
    beat_every: float = 5.0

    def __post_init__(self) -> None:
        self.name = self.name or f"gateway@{socket.gethostname()}:{os.getpid()}"
        self._asks: dict[str, GatewayAsk] = {}
        self._by_agent: dict[str, dict[str, GatewayAsk]] = {}
        """the same asks by agent: finding an agent's own costs its asks, not every agent's"""
        self._pending: dict[str, int] = {}
        """each agent's asks not yet ended (counting them ask by ask cost an agent's whole history)"""
        self._stack = contextlib.AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None
        self._agents: AgentRecords | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Gateway:
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._agents = AgentRecords(self.broker, self._tasks, self.agent_linger)
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
        attachments = checked_attachments(request, body.get("attachments", []))
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
