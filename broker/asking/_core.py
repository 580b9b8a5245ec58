"""What an ask needs of its broker: the asking core (docs/architecture.md).

``AskingCore`` owns the asking side of one ``Broker``: its settings and keys, the Redis clients it
opened, the commands pipeline, the process's inbox and background work, the asks in flight and the
answerers of its waterfall. ``Ask``, ``Agent`` and a provider's housekeeping receive it instead of
the whole ``Broker``, and everything they use of it is public here.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from redis.asyncio import Redis, RedisCluster

from .._commands import Commands
from .._ids import UniqueIds
from .._keys import TOMBSTONE_MS, Keys
from .._redis_errors import describe, unavailable
from .._scripts import Reply, detach, settled_cleanup, withdraw
from .._tasks import Background
from ..connection import redis_from_url
from ..errors import BROKER_UNAVAILABLE, CALLER_NOT_LIVE, UserQuestionError
from ..settings import BrokerSettings, Trust
from ..types import AskUserQuestionAnswer, AskUserQuestionRequest, Outcome, decode_outcome, encode
from ._inbox import Inbox

__all__ = ["Answerer", "AskingCore", "Caller", "InFlight", "Next", "Registration"]

log = logging.getLogger(__name__)

Client = Redis | RedisCluster
Next = Callable[[], Awaitable[AskUserQuestionAnswer]]
Answerer = Callable[[AskUserQuestionRequest, Next], Awaitable[AskUserQuestionAnswer]]

_CLEANUP_BATCH = 500
"""requests cleaned up in one settled_cleanup.lua call at most"""
_CLOSE_GRACE = 5.0
"""seconds closing waits for Redis to take the asks' ends and the queued commands (docs/reliability.md 7)"""


class Caller(Protocol):
    """The live agent instance an ask is made as (an ``Agent``)."""

    @property
    def id(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def alive(self) -> bool: ...
    async def revive(self) -> bool: ...


class InFlight(Protocol):
    """An ask this process waits on (an ``Ask``), as the core sees it."""

    def accepts(self, outcome: str, request_id: str | None = None) -> bool: ...
    async def end_on_close(self) -> None: ...


@dataclass(frozen=True)
class Registration:
    """One answerer of the waterfall; ``agent_id`` None: it hears every agent's asks."""

    answerer: Answerer
    agent_id: str | None


class AskingCore:
    """The asking side of one broker: opened and closed with it."""

    def __init__(self, settings: BrokerSettings, trust: Trust, url: str, connect: Callable[[], Client] | None) -> None:
        self.settings = settings
        self.trust = trust
        self.keys = Keys(settings.namespace)
        self.client_id = secrets.token_hex(8)
        name = f"qb-{self.client_id}"
        self.connect_commands = connect or (lambda: redis_from_url(url, name=name))
        self.connect_blocking = connect or (lambda: redis_from_url(url, name=name, blocking=True))
        """a new blocking client (a provider's reads take one of their own)"""
        self.request_ids = UniqueIds()
        self.timer_context = contextvars.Context()
        """the context an ask's deadline timer runs in: it reads no context variable, and the copy of the caller's
        context that ``call_at`` makes otherwise is kept per waiting ask (one per broker: a context is entered by
        one callback at a time, and a broker's callbacks run one at a time, on its loop)"""
        self.answerers: list[Registration] = []
        """the waterfall, in order (``Broker.on_request``)"""
        self.asks: dict[str, InFlight] = {}
        """the asks waiting on their request id"""
        self.attaching: dict[str, InFlight] = {}
        """a keyed ask's request id it may re-attach to, while ask.lua decides (its waiter is registered)"""
        self.rejected_outcomes = 0
        """answers (and remembered decisions) refused because no trusted key signed them for their request"""
        self.remembered_answers = 0
        """asks answered at once by remembered decisions (verified), not by a human asked now"""
        self.last_remembered_by: tuple[str, ...] = ()
        """who set the decisions of the latest such answer (their signed ``by``), for a one-ask tool to say so"""
        self._settled: list[str] = []
        """ids whose ask call returned with their outcome, not yet cleaned up"""
        self._open = False
        self._closing = False
        self._clients: list[Client] = []
        self._background = Background()
        self._cleanups = Background()
        self._commands: Commands | None = None
        self._inbox: Inbox | None = None

    # -- lifecycle ----------------------------------------------------------------

    async def open(self) -> None:
        """Connect, prove the server with a first write, and start the inbox's waiter, beat and sweep."""
        settings = self.settings
        try:
            commands_client = self.connect_commands()
            self._clients.append(commands_client)
            blocking = self.connect_blocking()
            self._clients.append(blocking)
            commands = self._commands = Commands(commands_client, give_up_after=settings.unavailable_after)
            inbox = self._inbox = Inbox(
                keys=self.keys,
                client_id=self.client_id,
                commands=commands,
                blocking=blocking,
                liveness_ttl=settings.client_ttl,
                unavailable_after=settings.unavailable_after,
                request_ttl=settings.request_ttl,
                sweep_every=settings.sweep_every,
                accepts=self.accepts,
            )
            self._background.start(commands.run, "qb-commands", restart=True)
            await self._first_beat(commands, inbox)
        except BaseException as error:
            await self._background.aclose()
            await self._close_clients()
            if isinstance(error, Exception):
                raise unavailable(error, "connecting") from error
            raise
        self._background.start(inbox.run, "qb-inbox", restart=True)
        self._background.start(inbox.keep_alive, "qb-liveness", restart=True)
        self._background.start(inbox.sweep, "qb-sweep", restart=True)
        self._open = True

    async def _first_beat(self, commands: Commands, inbox: Inbox) -> None:
        """The first write proves the server, the database index and the ACL user; a refusal is a coded error now
        rather than a hang later."""
        timeout = self.settings.connect_timeout
        try:
            async with asyncio.timeout(timeout):
                await inbox.beat()
        except TimeoutError as error:
            why = commands.last_refusal
            raise UserQuestionError(
                f"Redis did not answer within {timeout:g}s" + ("" if why is None else f": {describe(why)}"),
                BROKER_UNAVAILABLE,
            ) from (why or error)

    async def aclose(self) -> None:
        """Close: every ask still waiting ends (withdrawn, or with its outcome if one came first)."""
        if not self._open or self._closing:
            return
        self._closing = True
        self.flush_settled()  # queued now, so that the drain below waits for it
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CLOSE_GRACE  # one for every step: with Redis gone each would wait it out
        try:
            async with asyncio.timeout_at(deadline):
                asks = list(self.asks.values())
                if asks:
                    await asyncio.gather(*(ask.end_on_close() for ask in asks), return_exceptions=True)
                # Withdrawals in flight and queued clean-ups (an answered request's keys) finish first.
                await self._cleanups.wait(timeout=deadline - loop.time())
                if self._commands is not None:
                    await self._commands.drain()
        except TimeoutError:
            log.warning("closing with Redis commands unsent; their keys expire by TTL")
        finally:
            self._open = False
            closed = UserQuestionError("the broker was closed while the ask waited", BROKER_UNAVAILABLE)
            if self._inbox is not None:
                self._inbox.fail_all(closed)
            await self._cleanups.aclose()
            await self._background.aclose()
            if self._commands is not None:
                self._commands.fail_pending(closed)
            await self._close_clients()
            self._closing = False

    async def _close_clients(self) -> None:
        clients, self._clients = self._clients, []
        for client in reversed(clients):
            try:
                await client.aclose()
            except Exception as error:  # closing a broken connection must not hide the real error
                log.debug("closing a Redis client: %r", error)

    @property
    def commands(self) -> Commands:
        if self._commands is None or not self._open:
            raise UserQuestionError("the broker is not open: use `async with Broker(...)`", BROKER_UNAVAILABLE)
        return self._commands

    @property
    def open_commands(self) -> Commands | None:
        """The commands a clean-up nobody waits for goes through; None once the broker is closed (it is dropped)."""
        return self._commands if self._open else None

    @property
    def inbox(self) -> Inbox:
        """The process's answer waiter (its asks register their request ids with it)."""
        if self._inbox is None:
            raise UserQuestionError("the broker is not open: use `async with Broker(...)`", BROKER_UNAVAILABLE)
        return self._inbox

    # -- the asks' bookkeeping ---------------------------------------------------------

    def answerers_for(self, agent_id: str | None) -> list[Answerer]:
        """The waterfall an ask of ``agent_id`` runs: the answerers scoped to it and the unscoped, in order."""
        return [r.answerer for r in self.answerers if r.agent_id in (None, agent_id)]

    def accepts(self, request_id: str, outcome: str) -> bool:
        """Whether ``outcome`` may end the ask of ``request_id`` (an answer must be sealed for it).

        With no ask of this process to check it against, only an error may: fail closed.
        """
        ask = self.asks.get(request_id) or self.attaching.get(request_id)
        if ask is None:
            try:
                return decode_outcome(outcome).answer is None
            except msgspec.DecodeError:
                return False
        return ask.accepts(outcome, request_id)

    def rejected(self, request_id: str, what: str, then: str = "still waiting") -> None:
        """Count and log a refused answer, and note it in the askers' log (status and metrics show it there)."""
        self.rejected_outcomes += 1
        self.fire(
            "XADD",
            self.keys.asklog,
            "MAXLEN",
            "~",
            self.settings.audit_maxlen,
            "*",
            *("event", "rejected", "rid", request_id, "what", what, "client", self.client_id),
        )
        log.warning(
            "request %s: ignored %s that no trusted key signed for it (a forgery, or a provider with an"
            " untrusted key); %s",
            request_id,
            what,
            then,
        )

    def track(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run clean-up work that must finish even if its caller is cancelled; awaited on close."""

        async def run() -> Any:
            return await work

        return self._cleanups.start(run, "qb-cleanup")

    def forget_settled(self, request_id: str) -> None:
        """Queue the clean-up of a request whose ask call returned with its outcome.

        The requests resolved in one tick go in one settled_cleanup.lua call, sent with the
        next pipeline.
        """
        if self._commands is None or not self._open:
            return
        if not self._settled:
            asyncio.get_running_loop().call_soon(self.flush_settled)
        self._settled.append(request_id)

    def flush_settled(self) -> None:
        ids, self._settled = self._settled, []
        if self._commands is None or not self._open:
            return
        for start in range(0, len(ids), _CLEANUP_BATCH):
            keys = [
                key for i in ids[start : start + _CLEANUP_BATCH] for key in (self.keys.request(i), self.keys.outcome(i))
            ]
            settled_cleanup(self._commands, settled=keys, tombstone=TOMBSTONE_MS, client=self.client_id)

    def fire(self, *args: Any) -> None:
        """Queue a clean-up command nobody waits for; dropped once the broker is closed."""
        if self._commands is not None and self._open:
            self._commands.fire(*args)

    # -- the scripts an ask's ends run ----------------------------------------------------

    async def withdraw(self, request_id: str, how: str) -> Reply:
        """withdraw.lua: the asker gave the request up (``how``: withdrawn, aborted or timed_out)."""
        keys = self.keys
        return await withdraw(
            self.commands,
            request=keys.request(request_id),
            requests=keys.requests,
            asklog=keys.asklog,
            rid=request_id,
            state=how,
            reason=f"the asker {how}",
            group="providers",
            log_max=self.settings.audit_maxlen,
        )

    async def detach(self, request_id: str) -> Reply:
        """detach.lua: a keyed request stays pending, answerable, for its grace, with this process away."""
        keys, settings = self.keys, self.settings
        return await detach(
            self.commands,
            request=keys.request(request_id),
            requests=keys.requests,
            away=keys.away,
            asklog=keys.asklog,
            rid=request_id,
            client=self.client_id,
            log_max=settings.audit_maxlen,
            result_ttl=int(settings.result_ttl * 1000),
        )

    def clean_up(self, request_id: str) -> None:
        """Queue the clean-up of a request whose outcome the withdrawal collected; dropped once closed."""
        commands = self.open_commands
        if commands is not None:
            cleanup = [self.keys.request(request_id), self.keys.outcome(request_id)]
            settled_cleanup(commands, settled=cleanup, tombstone=TOMBSTONE_MS, client=self.client_id)

    def tell_replaced(self, request_id: str, client_id: str) -> None:
        """End the wait of the process a keyed ask re-attached from, should it still wait (a paused one)."""
        error = UserQuestionError("another process re-attached to this keyed question", CALLER_NOT_LIVE).to_payload()
        # '~': an ending for a waiter only; the receiver never cleans the request up on it.
        notice = f"{request_id} ~{encode(Outcome(error=error)).decode()}"
        inbox = self.keys.inbox(client_id)
        self.fire("RPUSH", inbox, notice)
        self.fire("PEXPIRE", inbox, int(self.settings.result_ttl * 1000))
