"""The broker: ``ask()`` for agents, ``provider()`` for UIs, over one Redis namespace."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from ._commands import SCRIPTS, Commands
from ._ids import UniqueIds
from ._inbox import Inbox
from ._keys import TOMBSTONE_MS, Keys
from ._redis_errors import describe, unavailable
from ._tasks import Background, running
from .agents import Agent
from .connection import redis_from_url
from .decisions import (
    Decision,
    decision_keys,
    decision_setters,
    list_decisions,
    revoke_decision,
    verified_decisions,
)
from .errors import (
    ASK_ABORTED,
    ASK_TIMED_OUT,
    BAD_REQUEST,
    BROKER_UNAVAILABLE,
    CALLER_NOT_LIVE,
    EMPTY_QUESTIONS,
    NO_SIGNING_KEY,
    NO_TRUSTED_KEY,
    UserQuestionError,
)
from .provider import Provider, ProviderSettings, acquire_lease, release_lease
from .signing import SigningKey, TrustedKeys
from .types import AskUserQuestionAnswer, AskUserQuestionRequest, Outcome, decode_outcome, encode
from .validation import Limits, check_answer, check_request

__all__ = ["Answerer", "Broker", "Next"]

log = logging.getLogger(__name__)

Next = Callable[[], Awaitable[AskUserQuestionAnswer]]
Answerer = Callable[[AskUserQuestionRequest, Next], Awaitable[AskUserQuestionAnswer]]
_Withdrawal = Literal["withdrawn", "aborted", "timed_out"]
_Client = Redis | RedisCluster
_CLEANUP_BATCH = 500
"""requests cleaned up in one settled_cleanup.lua call at most"""


@dataclass(frozen=True)
class _Registration:
    answerer: Answerer
    agent_id: str | None


_KEY = re.compile(r"^[^\x00-\x20\x7f]{1,200}$")
_ATTACH_TRIES = 5


@dataclass(frozen=True)
class _Durable:
    """A keyed ask's key and detach grace."""

    key: str
    grace_ms: int

    @staticmethod
    def digest(wire: bytes) -> str:
        """What makes two asks under one key the same request: their wire JSON."""
        return hashlib.sha1(wire).hexdigest()


@dataclass(frozen=True)
class _Routing:
    """What may answer an ask besides a human answering it alone."""

    remember: bool = True
    """a remembered decision may answer it, and its answer may be remembered"""
    coalesce: bool = True
    """it may be presented once with identical pending requests of other askers"""
    lookup: bool = True
    """look remembered decisions up (False after a lookup found one that does not verify)"""

    def __post_init__(self) -> None:
        for name in ("remember", "coalesce"):
            if not isinstance(getattr(self, name), bool):
                raise UserQuestionError(f"{name} must be True or False", BAD_REQUEST)


def _durable(key: object, grace: float | None, default: float) -> _Durable | None:
    if key is None:
        if grace is not None:
            raise UserQuestionError("detach_grace applies to a keyed ask only: pass key= too", BAD_REQUEST)
        return None
    if not isinstance(key, str) or not _KEY.match(key):
        raise UserQuestionError(
            f"key {key!r} must be 1-200 characters with no spaces or control characters", BAD_REQUEST
        )
    grace = default if grace is None else grace
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 30 * 86_400:
        raise UserQuestionError(f"detach_grace {grace!r} must be 0 to 30 days, in seconds", BAD_REQUEST)
    return _Durable(key, int(grace * 1000))


class Broker:
    """Agents ask through it; providers answer through it. An async context manager.

    ``unavailable_after`` bounds how long anything waits out an unreachable Redis before it
    fails with ``BROKER_UNAVAILABLE``; opening the broker waits at most ``connect_timeout``.
    ``detach_grace`` is how long a keyed ask (``ask(..., key=)``) stays pending, answerable, after
    its asker stopped (killed, cancelled, closed), for a new instance to re-attach.
    ``min_replicas`` makes lease acquisition and every
    settlement wait (WAIT) until that many replicas have them, for up to ``replica_timeout``
    seconds each try, before the provider serves or the asker is told. ``connect`` replaces
    the client builder (a fakeredis client, say) for every connection the broker opens.

    ``trusted_keys`` are the answering side's public keys (``qbpk1:...`` texts, or a
    ``TrustedKeys``): an answer counts only when one of them signed it for this very request, and
    asking without any is ``NO_TRUSTED_KEY``. ``signing_key`` (``qbsk1:...`` or a ``SigningKey``)
    is what a provider signs its answers with (``provider()`` without one is ``NO_SIGNING_KEY``);
    a broker trusts its own signing key's public half.
    """

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        namespace: str = "default",
        *,
        lease_ttl: float = 10.0,
        agent_ttl: float = 15.0,
        client_ttl: float = 15.0,
        request_ttl: float = 86_400.0,
        result_ttl: float = 600.0,
        audit_maxlen: int = 10_000,
        dead_maxlen: int = 10_000,
        unavailable_after: float = 30.0,
        connect_timeout: float = 5.0,
        sweep_every: float = 5.0,
        min_replicas: int = 0,
        replica_timeout: float = 1.0,
        detach_grace: float = 300.0,
        limits: Limits | None = None,
        connect: Callable[[], _Client] | None = None,
        trusted_keys: TrustedKeys | Iterable[str] | str = (),
        signing_key: SigningKey | str | None = None,
    ) -> None:
        self.keys = Keys(namespace)
        if isinstance(trusted_keys, str):
            trusted_keys = TrustedKeys.parse(trusted_keys)
        # A copy: adding this broker's own key below must not make another broker sharing the object trust it.
        self.trusted_keys = TrustedKeys(trusted_keys.keys if isinstance(trusted_keys, TrustedKeys) else trusted_keys)
        self.signing_key = SigningKey.from_text(signing_key) if isinstance(signing_key, str) else signing_key
        if self.signing_key is not None:
            self.trusted_keys.add(self.signing_key)
        self.rejected_outcomes = 0
        """answers (and remembered decisions) refused because no trusted key signed them for their request"""
        self.remembered_answers = 0
        """asks answered at once by remembered decisions (verified), not by a human asked now"""
        self.last_remembered_by: tuple[str, ...] = ()
        """who set the decisions of the latest such answer (their signed ``by``), for a one-ask tool to say so"""
        self.namespace = namespace
        self.lease_ttl = lease_ttl
        self.agent_ttl = agent_ttl
        self.client_ttl = client_ttl
        self.request_ttl = request_ttl
        self.limits = limits or Limits()
        self.client_id = secrets.token_hex(8)
        self._request_ids = UniqueIds()
        self.unavailable_after = unavailable_after
        self.connect_timeout = connect_timeout
        self.sweep_every = sweep_every
        self.detach_grace = detach_grace
        name = f"qb-{self.client_id}"
        self._connect_commands = connect or (lambda: redis_from_url(url, name=name))
        self._connect_blocking = connect or (lambda: redis_from_url(url, name=name, blocking=True))
        self._provider_settings = ProviderSettings(
            lease_ttl=lease_ttl,
            result_ttl=result_ttl,
            audit_maxlen=audit_maxlen,
            dead_maxlen=dead_maxlen,
            limits=self.limits,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            liveness_grace=max(agent_ttl, client_ttl),
        )
        self._answerers: list[_Registration] = []
        self._agents: dict[str, Agent] = {}
        self._asks: dict[str, _Ask] = {}
        self._attaching: dict[str, _Ask] = {}
        """a keyed ask's request id it may re-attach to, while ask.lua decides (its waiter is registered)"""
        self._settled: list[str] = []
        """ids whose ask call returned with their outcome, not yet cleaned up"""
        self._open = False
        self._closing = False
        self._clients: list[_Client] = []
        self._background = Background()
        self._cleanups = Background()
        self._commands: Commands | None = None
        self._inbox: Inbox | None = None

    def __repr__(self) -> str:  # the URL may carry a password
        return f"Broker(namespace={self.namespace!r}, client_id={self.client_id!r})"

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Broker:
        try:
            commands_client = self._connect_commands()
            self._clients.append(commands_client)
            blocking = self._connect_blocking()
            self._clients.append(blocking)
            self._commands = Commands(commands_client, give_up_after=self.unavailable_after)
            self._inbox = Inbox(
                keys=self.keys,
                client_id=self.client_id,
                commands=self._commands,
                blocking=blocking,
                liveness_ttl=self.client_ttl,
                unavailable_after=self.unavailable_after,
                request_ttl=self.request_ttl,
                sweep_every=self.sweep_every,
                accepts=self._accepts,
            )
            self._background.start(self._commands.run, "qb-commands", restart=True)
            # The first write proves the server, the database index and the ACL user; a
            # refusal is a coded error now rather than a hang later.
            try:
                async with asyncio.timeout(self.connect_timeout):
                    await self._inbox.beat()
            except TimeoutError as error:
                why = self._commands.last_refusal
                raise UserQuestionError(
                    f"Redis did not answer within {self.connect_timeout:g}s"
                    + ("" if why is None else f": {describe(why)}"),
                    BROKER_UNAVAILABLE,
                ) from (why or error)
        except BaseException as error:
            await self._background.aclose()
            await self._close_clients()
            if isinstance(error, Exception):
                raise unavailable(error, "connecting") from error
            raise
        inbox = self._inbox
        self._background.start(inbox.run, "qb-inbox", restart=True)
        self._background.start(inbox.keep_alive, "qb-liveness", restart=True)
        self._background.start(inbox.sweep, "qb-sweep", restart=True)
        self._open = True
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close: every ask still waiting ends (withdrawn, or with its outcome if one came first)."""
        if not self._open or self._closing:
            return
        self._closing = True
        self._flush_settled()  # queued now, so that the drain below waits for it
        try:
            asks = list(self._asks.values())
            if asks:
                await asyncio.wait_for(
                    asyncio.gather(*(ask.end_on_close() for ask in asks), return_exceptions=True), timeout=5.0
                )
            # Withdrawals in flight and queued clean-ups (an answered request's keys) finish first.
            await self._cleanups.wait(timeout=5.0)
            if self._commands is not None:
                await asyncio.wait_for(self._commands.drain(), timeout=5.0)
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

    def _accepts(self, request_id: str, outcome: str) -> bool:
        """Whether ``outcome`` may end the ask of ``request_id`` (an answer must be sealed for it).

        With no ask of this process to check it against, only an error may: fail closed.
        """
        ask = self._asks.get(request_id) or self._attaching.get(request_id)
        if ask is None:
            try:
                return decode_outcome(outcome).answer is None
            except msgspec.DecodeError:
                return False
        return ask.accepts(outcome, request_id)

    def _rejected(self, request_id: str, what: str, then: str = "still waiting") -> None:
        """Count and log a refused answer, and note it in the askers' log (status and metrics show it there)."""
        self.rejected_outcomes += 1
        self._fire(
            "XADD",
            self.keys.asklog,
            "MAXLEN",
            "~",
            self._provider_settings.audit_maxlen,
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

    def _track(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run clean-up work that must finish even if its caller is cancelled; awaited on close."""

        async def run() -> Any:
            return await work

        return self._cleanups.start(run, "qb-cleanup")

    def _forget_settled(self, request_id: str) -> None:
        """Queue the clean-up of a request whose ask call returned with its outcome.

        The requests resolved in one tick go in one settled_cleanup.lua call, sent with the
        next pipeline.
        """
        if self._commands is None or not self._open:
            return
        if not self._settled:
            asyncio.get_running_loop().call_soon(self._flush_settled)
        self._settled.append(request_id)

    def _flush_settled(self) -> None:
        ids, self._settled = self._settled, []
        if self._commands is None or not self._open:
            return
        for start in range(0, len(ids), _CLEANUP_BATCH):
            keys = [
                key for i in ids[start : start + _CLEANUP_BATCH] for key in (self.keys.request(i), self.keys.outcome(i))
            ]
            self._commands.fire_script(SCRIPTS["settled_cleanup"], keys, [TOMBSTONE_MS, self.client_id])

    def _fire_script(self, name: str, keys: list[str], args: list[Any]) -> None:
        """Queue a clean-up script nobody waits for; dropped once the broker is closed."""
        if self._commands is not None and self._open:
            self._commands.fire_script(SCRIPTS[name], keys, args)

    def _fire(self, *args: Any) -> None:
        """Queue a clean-up command nobody waits for; dropped once the broker is closed."""
        if self._commands is not None and self._open:
            self._commands.fire(*args)

    @property
    def commands(self) -> Commands:
        if self._commands is None or not self._open:
            raise UserQuestionError("the broker is not open: use `async with Broker(...)`", BROKER_UNAVAILABLE)
        return self._commands

    # -- agents ---------------------------------------------------------------------

    @asynccontextmanager
    async def agent(
        self, agent_id: str, owner: Agent | str | None = None, *, restart: bool = False
    ) -> AsyncIterator[Agent]:
        """Register this process as the agent ``agent_id`` for the block; ``owner`` makes it an owned child.

        Processes registered under one id are one live instance and ask at once (several shell steps
        of one agent). ``restart=True`` starts a new instance of the id instead: every process
        registered before is no longer live (its asks fail, its pending questions are withdrawn).
        Registering under another owner than the live instance's starts a new instance too.
        """
        owner_id = owner.id if isinstance(owner, Agent) else owner
        agent = Agent(self, agent_id, owner_id, restart=restart)
        commands = self.commands
        try:
            reply = await agent.register(commands, self.keys, self.agent_ttl)
        except (RedisError, OSError) as error:
            raise unavailable(error, "registering the agent") from error
        if reply[0] != "ok":
            raise UserQuestionError(reply[2], reply[1])
        self._agents[agent_id] = agent
        try:
            async with running(lambda: agent.heartbeat(commands, self.keys, self.agent_ttl)):
                yield agent
        finally:
            if self._agents.get(agent_id) is agent:
                del self._agents[agent_id]
            try:
                async with asyncio.timeout(self.agent_ttl):  # past it, the record expires anyway
                    await agent.remove(commands, self.keys)
            except Exception as error:
                log.warning("could not remove agent %s: %r (its record expires)", agent_id, error)

    # -- the waterfall --------------------------------------------------------------

    def on_request(
        self, answerer: Answerer, *, agent: Agent | str | None = None, prepend: bool = False
    ) -> Callable[[], None]:
        """Add an answerer to this process's waterfall; returns its disposer."""
        registration = _Registration(answerer, agent.id if isinstance(agent, Agent) else agent)
        if prepend:
            self._answerers.insert(0, registration)
        else:
            self._answerers.append(registration)

        def dispose() -> None:
            if registration in self._answerers:
                self._answerers.remove(registration)

        return dispose

    # -- asking ---------------------------------------------------------------------

    async def ask(
        self,
        request: AskUserQuestionRequest,
        *,
        abort: asyncio.Event | None = None,
        timeout: float | None = None,
        key: str | None = None,
        detach_grace: float | None = None,
        remember: bool = True,
        coalesce: bool = True,
    ) -> AskUserQuestionAnswer:
        """Ask a human; ``request.agent`` is an agent registered by this broker (its id or the instance).

        ``key`` names the question durably (per namespace and asking agent id): if this process
        stops, the question stays pending for ``detach_grace`` seconds (the broker's by default),
        and a new live instance asking the same request with the same key re-attaches to it.
        A remembered decision that matches every question answers at once; ``remember=False``
        always asks a human (and no provider may remember the answer). Identical pending requests
        of several askers are presented once and settled by one answer; ``coalesce=False`` keeps
        this one apart.
        """
        named: object = request.agent
        if isinstance(named, Agent):
            agent: Agent | None = named
            request = msgspec.structs.replace(request, agent=named.id)  # as ask_as() does
        elif named is not None and not isinstance(named, str):
            raise UserQuestionError(
                f"request.agent must be an agent id or an Agent, not {type(named).__name__}", BAD_REQUEST
            )
        else:
            agent = self._agents.get(named) if named is not None else None
        durable = _durable(key, detach_grace, self.detach_grace)
        return await self._ask(request, agent, abort, timeout, durable, _Routing(remember, coalesce))

    async def ask_as(
        self,
        agent: Agent,
        request: AskUserQuestionRequest,
        *,
        abort: asyncio.Event | None = None,
        timeout: float | None = None,
        key: str | None = None,
        detach_grace: float | None = None,
        remember: bool = True,
        coalesce: bool = True,
    ) -> AskUserQuestionAnswer:
        if request.agent != agent.id:
            request = msgspec.structs.replace(request, agent=agent.id)
        durable = _durable(key, detach_grace, self.detach_grace)
        return await self._ask(request, agent, abort, timeout, durable, _Routing(remember, coalesce))

    async def _ask(
        self,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        abort: asyncio.Event | None,
        timeout: float | None,
        durable: _Durable | None = None,
        routing: _Routing = _Routing(),
    ) -> AskUserQuestionAnswer:
        try:
            return await self._checked_ask(request, agent, abort, timeout, durable, routing)
        except (RedisError, OSError) as error:  # a refusal no retry can mend (NOPERM, say)
            raise unavailable(error, "asking") from error

    async def _checked_ask(
        self,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        abort: asyncio.Event | None,
        timeout: float | None,
        durable: _Durable | None,
        routing: _Routing,
    ) -> AskUserQuestionAnswer:
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        if not self.trusted_keys:
            raise UserQuestionError(
                "this broker trusts no answering key: pass trusted_keys= (the providers' public keys, qbpk1:...)",
                NO_TRUSTED_KEY,
            )
        if abort is not None and abort.is_set():
            raise UserQuestionError("the ask was aborted before it started", ASK_ABORTED)
        if not request.questions:
            raise UserQuestionError("the request has no questions", EMPTY_QUESTIONS)
        if request.agent is not None and (agent is None or not agent.alive):
            raise UserQuestionError(f"agent {request.agent!r} is not a live instance here", CALLER_NOT_LIVE)
        try:
            check_request(request, self.limits)
            problem = None
        except UserQuestionError as error:
            problem = error
        answerers = [r.answerer for r in self._answerers if r.agent_id in (None, request.agent)]
        if agent is not None and (problem is not None or answerers):
            await self._gate(request, agent)  # the seeds' order: the caller gate first
        if problem is not None:
            raise problem

        ask = _Ask(self, request, agent, deadline, durable, routing)
        if not answerers and abort is None:
            return await (ask.remote() if deadline is None else ask.remote_until(deadline))
        return await ask.run(answerers, abort, deadline)

    async def _gate(self, request: AskUserQuestionRequest, agent: Agent) -> None:
        reply = await self._script("ask", request, agent, "", gate_only=True)
        if reply[0] != "ok":
            raise UserQuestionError(reply[2], reply[1])

    async def _script(
        self,
        name: str,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        request_id: str,
        *,
        gate_only: bool = False,
        timeout_ms: str = "",
        durable: _Durable | None = None,
        named: str | None = None,
        routing: _Routing = _Routing(),
        wire: bytes | None = None,
    ) -> Any:
        """Run ask.lua; a keyed ask names the durable key's request as it read it (``named``)."""
        body = wire if wire is not None else encode(request)
        keys = self.keys
        request_key = keys.request(request_id)
        script_keys = [
            keys.requests,
            request_key,
            keys.agent(agent.id) if agent is not None else request_key,
            keys.asklog,
            keys.durable(request.agent, durable.key) if durable is not None else request_key,
            keys.request(named) if named else request_key,
        ]
        remembered: list[Any] = []
        if not gate_only:  # ask.lua's KEYS[7] and ARGV[14..]: coalescing, the provider check, remembered decisions
            lookup = routing.remember and routing.lookup
            script_keys += [keys.outcome(request_id), keys.away]
            found = decision_keys(keys, request) if lookup else []
            looked_up = len(found) // 2
            remembered = [
                "" if routing.coalesce else "solo",
                ("1" if routing.lookup else "x") if routing.remember else "0",
                int(self._provider_settings.result_ttl * 1000),
                keys.provider,  # read-only keys come in ARGV (broker/roles.py: the asker may only read them)
                keys.standbys,
                looked_up,
                *(item.id for item in request.questions[:looked_up]),
                *found,
            ]
        return await self.commands.script(
            SCRIPTS[name],
            script_keys,
            [
                request_id,
                b"" if gate_only else body,
                agent.id if agent is not None else "",
                agent.token if agent is not None else "",
                self.client_id,
                int(self.request_ttl * 1000),
                self._provider_settings.audit_maxlen,
                timeout_ms,
                "1" if gate_only else "0",
                agent.fingerprint if agent is not None else "",
                durable.key if durable is not None else "",
                durable.grace_ms if durable is not None else 0,
                durable.digest(body) if durable is not None else "",
                *remembered,
            ],
        )

    # -- remembered decisions ------------------------------------------------------------

    async def decisions(self) -> list[Decision]:
        """The namespace's live remembered decisions, oldest first."""
        return await list_decisions(self.commands, self.keys)

    async def revoke_decision(self, decision_id: str, *, by: str = "") -> bool:
        """Forget a remembered decision (audited with ``by``); False when there is no such live one."""
        return await revoke_decision(
            self.commands, self.keys, decision_id, by=by, audit_maxlen=self._provider_settings.audit_maxlen
        )

    # -- providing ------------------------------------------------------------------

    async def request_handover(self, to: str, *, by: str, ttl: float | None = None) -> None:
        """Ask the lease holder to hand the namespace's lease to provider ``to`` (standing by), for ``by``.

        The holder sees it at its next renewal (within a third of the lease TTL): its iteration ends,
        and leaving its ``provider()`` block releases the lease. Meanwhile, and for ``ttl`` seconds
        at most (default: three lease TTLs, at least 30 s), only ``to`` may take the lease, so the
        holder standing by again does not take it back. Needs the answering side's Redis user.
        """
        if not to or "\n" in to:
            raise UserQuestionError("a handover names the provider to take the lease, on one line", BAD_REQUEST)
        ttl_ms = int((ttl if ttl is not None else max(30.0, 3 * self.lease_ttl)) * 1000)
        if ttl_ms <= 0:
            raise UserQuestionError("a handover's ttl is positive", BAD_REQUEST)
        who = " ".join(by.split())[:200]
        try:
            await self.commands.call("SET", self.keys.handover, f"{to}\n{who}", "PX", ttl_ms)
        except (RedisError, OSError) as error:
            raise unavailable(error, "asking for a handover") from error

    @asynccontextmanager
    async def provider(
        self,
        name: str,
        *,
        standby: bool = True,
        on_standby: Callable[[str], Any] | None = None,
        coalesce: bool = True,
    ) -> AsyncIterator[Provider]:
        """Hold the namespace's provider lease for the block (waiting for it when ``standby``).

        ``coalesce=False``: present every request on its own, never identical requests of several
        askers as one (a policy that decides by the asking agent must see each asker).

        Inside the block, a Redis failure never ends the provider: its reads and renewals wait
        it out, and once the lease is lost (``provider.lost``) iterating raises ``LEASE_LOST``.
        """
        commands = self.commands
        if self.signing_key is None:
            raise UserQuestionError(
                "a provider signs its answers: pass signing_key= (qbsk1:..., made by `qbroker keys new`)",
                NO_SIGNING_KEY,
            )
        signing_key = self.signing_key
        blocking = self._connect_blocking()
        try:
            try:
                # The Redis clock, read once: answers are sealed with when they were given (by it).
                seconds, micros = await commands.call("TIME")
                token, epoch = await acquire_lease(
                    commands=commands,
                    blocking=blocking,
                    keys=self.keys,
                    name=name,
                    settings=self._provider_settings,
                    standby=standby,
                    on_standby=on_standby,
                )
            except (RedisError, OSError) as error:
                raise unavailable(error, "taking the provider lease") from error
            provider = Provider(
                keys=self.keys,
                name=name,
                token=token,
                epoch=epoch,
                commands=commands,
                blocking=blocking,
                settings=self._provider_settings,
                signing_key=signing_key,
                redis_ms=int(seconds) * 1000 + int(micros) // 1000,
                coalesce=coalesce,
            )
            log.info("provider %s holds the lease of %s (epoch %d)", name, self.namespace, epoch)
            try:
                async with running(provider.keep_lease, provider.read, provider.reclaim, provider.seal_audit):
                    yield provider
            finally:
                try:
                    # Bounded: past its TTL the lease lapses by itself anyway.
                    async with asyncio.timeout(self.lease_ttl):
                        if not provider.lost:
                            await provider.checkpoint()  # seal what this provider leaves behind
                        await release_lease(commands, self.keys, provider)
                except Exception as error:
                    log.warning("could not release the lease: %r (it lapses after its TTL)", error)
        finally:
            await blocking.aclose()


class _Ask:
    """One ask in flight: enqueue, wait, and withdraw on every way out."""

    def __init__(
        self,
        broker: Broker,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        deadline: float | None,
        durable: _Durable | None = None,
        routing: _Routing = _Routing(),
    ) -> None:
        self.broker = broker
        self.request = request
        self.agent = agent
        self.deadline = deadline
        self.durable = durable
        self.request_id = broker._request_ids.next()
        self.wire = encode(request)
        """the request JSON as asked: what the answer's seal names (by its SHA-256)"""
        self.request_sha = hashlib.sha256(self.wire).hexdigest()
        self.withdrawal: _Withdrawal = "withdrawn"
        self.future: asyncio.Future[str] | None = None
        self.ended_on_close = False
        self.routing = routing
        self._checked: tuple[str, Outcome] | None = None
        """the last outcome ``accepts`` decoded and let through: the ask returns it without decoding again"""
        self.attached_unsure: str | None = None
        """a keyed request the re-attach may have made this process's before the ask was stopped"""
        self.settled_after: int | None = None
        """for a keyed ask that re-attached: the earliest (unix ms, Redis clock) its outcome may have
        been settled, the key being the asking side's to rewrite (an old answer must not pass)"""

    async def run(
        self, answerers: list[Answerer], abort: asyncio.Event | None, deadline: float | None
    ) -> AskUserQuestionAnswer:
        """Run the waterfall, racing the abort signal and the deadline."""
        work = asyncio.ensure_future(self._waterfall(answerers, 0))
        aborted = asyncio.ensure_future(abort.wait()) if abort is not None else None
        waits: set[asyncio.Future[Any]] = {work} if aborted is None else {work, aborted}
        timeout = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._stop(work, "withdrawn")
            raise
        finally:
            if aborted is not None:
                aborted.cancel()
        if work.done():
            return work.result()
        code, why = (
            (ASK_ABORTED, "the ask was aborted")
            if aborted is not None and aborted.done()
            else (ASK_TIMED_OUT, "nobody answered in time")
        )
        try:
            return await self._stop(work, "aborted" if code == ASK_ABORTED else "timed_out")
        except asyncio.CancelledError:
            raise UserQuestionError(why, code) from None
        except UserQuestionError as error:
            if error.code in (ASK_ABORTED, ASK_TIMED_OUT, BROKER_UNAVAILABLE):
                raise UserQuestionError(why, code) from error
            raise  # a domain error from the far side wins over a simultaneous abort
        except Exception as error:
            raise UserQuestionError(why, code) from error

    async def remote_until(self, deadline: float) -> AskUserQuestionAnswer:
        """``remote()`` in the caller's own task, ended at ``deadline`` as ``run()`` would end it.

        The common case (no answerers, no abort signal, a timeout) without a second task and
        ``asyncio.wait``: a timer cancels this task at the deadline, the withdrawal says
        ``timed_out``, and an outcome that won the race with the withdrawal is still returned.
        """
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            self.withdrawal = "timed_out"
            task.cancel()

        why = "nobody answered in time"
        handle = asyncio.get_running_loop().call_at(deadline, expire)
        try:
            answer = await self.remote()
        except asyncio.CancelledError:
            if not expired or task.uncancel() > 0:  # the caller's own cancellation too
                raise
            raise UserQuestionError(why, ASK_TIMED_OUT) from None
        except UserQuestionError as error:
            if not expired:
                raise
            task.uncancel()
            if error.code in (ASK_ABORTED, ASK_TIMED_OUT, BROKER_UNAVAILABLE):
                raise UserQuestionError(why, ASK_TIMED_OUT) from error
            raise  # a domain error from the far side wins over a simultaneous timeout
        except Exception as error:
            if not expired:
                raise
            task.uncancel()
            raise UserQuestionError(why, ASK_TIMED_OUT) from error
        finally:
            handle.cancel()
        if expired:
            task.uncancel()
        return answer

    async def _stop(
        self, work: asyncio.Future[AskUserQuestionAnswer], withdrawal: _Withdrawal
    ) -> AskUserQuestionAnswer:
        self.withdrawal = withdrawal
        work.cancel()
        return await work

    async def _waterfall(self, answerers: list[Answerer], index: int) -> AskUserQuestionAnswer:
        if index == len(answerers):
            return await self.remote()

        async def next_answerer() -> AskUserQuestionAnswer:
            return await self._waterfall(answerers, index + 1)

        answer = await answerers[index](self.request, next_answerer)
        return check_answer(self.request, answer, self.broker.limits)

    async def remote(self) -> AskUserQuestionAnswer:
        """The end of the chain: enqueue for the namespace's provider and wait."""
        broker = self.broker
        inbox = broker._inbox
        assert inbox is not None
        decided: AskUserQuestionAnswer | None = None
        reply: Any = ("",)
        future = self.future = inbox.expect(self.request_id)
        broker._asks[self.request_id] = self
        try:
            try:
                timeout_ms = ""
                if self.deadline is not None:
                    remaining = self.deadline - asyncio.get_running_loop().time()
                    timeout_ms = str(max(1, int(remaining * 1000)))
                if self.durable is None:
                    reply = await broker._script(
                        "ask",
                        self.request,
                        self.agent,
                        self.request_id,
                        timeout_ms=timeout_ms,
                        routing=self.routing,
                        wire=self.wire,
                    )
                else:
                    reply = await self._ask_keyed(timeout_ms)
                    future = self.future or future
                kept = await self._kept_outcome(reply[1]) if reply[0] == "settled" else None
                if reply[0] == "decided":  # a remembered decision answered it in the script
                    decided = self._verified_decision(reply)
                    outcome = ""
                elif kept is not None:
                    outcome = kept
                else:
                    if reply[0] not in ("ok", "attached", "settled"):
                        raise UserQuestionError(reply[2], reply[1])
                    inbox.enqueued(self.request_id)
                    # Shielded: cancelling this task must not cancel the future the inbox resolves.
                    outcome = await asyncio.shield(future)
            except asyncio.CancelledError:
                # Shielded in a task of the broker's: a caller that keeps cancelling (an anyio
                # cancel scope does) must not stop the withdrawal half-way.
                settled = await asyncio.shield(broker._track(self._withdraw(future)))
                if settled is None:
                    raise
                outcome = settled
        except Exception as error:
            coded = error if isinstance(error, UserQuestionError) else unavailable(error, "asking")
            if coded.code == BROKER_UNAVAILABLE and not self.ended_on_close:
                # Redis failed us; once it is back, a human must not answer into the void (a keyed
                # question is only detached: its asker may come back for it).
                broker._track(self._withdraw_quietly(future))
            if coded is error:
                raise
            raise coded from error
        finally:
            inbox.forget(self.request_id)
            broker._asks.pop(self.request_id, None)
        # The request's keys go only now, after the ask call returned: a retried ask can then
        # never land after them and enqueue the question again.
        broker._forget_settled(self.request_id)
        if self.durable is not None and reply[0] != "decided":  # received: the key names nothing any more
            broker._fire_script(
                "durable_release", [broker.keys.durable(self.request.agent, self.durable.key)], [self.request_id]
            )
        if reply[0] == "decided":
            if decided is not None:
                broker.remembered_answers += 1
                broker.last_remembered_by = decision_setters(list(reply[3]) if len(reply) > 3 else [])
                return decided
            # No trusted key signed what the lookup found for this request: a human answers, as a new request.
            broker._rejected(self.request_id, "a remembered decision", "asking a human instead")
            self.request_id = broker._request_ids.next()
            self.routing = dataclasses.replace(self.routing, lookup=False)
            return await self.remote()
        checked = self._checked
        return _settled(outcome, checked[1] if checked is not None and checked[0] is outcome else None)

    def accepts(self, outcome: str, request_id: str | None = None) -> bool:
        """Whether ``outcome`` may end this ask: an error may; an answer only when sealed for this request.

        ``request_id``: the request it would end (a keyed ask's re-attach names another than its own).
        """
        broker = self.broker
        request_id = request_id or self.request_id
        try:
            decoded = decode_outcome(outcome)
        except msgspec.DecodeError:
            broker._rejected(request_id, "an outcome that does not decode")
            return False
        if decoded.answer is None:
            self._checked = (outcome, decoded)
            return True  # forging an error ends the ask, as withdrawing it would (docs/security.md)
        if decoded.proof is None or decoded.signed is None:
            broker._rejected(request_id, "an unsigned answer")
            return False
        durable = self.durable
        if not broker.trusted_keys.verify_outcome(
            namespace=broker.namespace,
            request_id=request_id,
            request_sha=self.request_sha,
            agent=self.request.agent or "",
            # A keyed request may have been shown to the provider under another process of its agent.
            client=None if durable is not None else broker.client_id,
            body=decoded.signed,
            proof=decoded.proof,
            durable=durable.key if durable is not None else "",
            settled_after=self.settled_after,
        ):
            broker._rejected(request_id, "an answer")
            return False
        self._checked = (outcome, decoded)
        return True

    def _verified_decision(self, reply: Any) -> AskUserQuestionAnswer | None:
        broker = self.broker
        records = list(reply[3]) if len(reply) > 3 else []
        now_ms = int(reply[2]) if len(reply) > 2 else 0
        return verified_decisions(broker.trusted_keys, broker.namespace, self.request, records, now_ms)

    async def _ask_keyed(self, timeout_ms: str) -> Any:
        """ask.lua for a keyed ask: a new request, or the key's own one re-attached.

        The durable key is read first (a script may touch only the keys it is given); the
        script refuses with 'retry' when it changed meanwhile. Both possible request ids are
        awaited before the script runs, so a notice arriving just after it is never missed.
        """
        broker = self.broker
        inbox = broker._inbox
        assert inbox is not None and self.durable is not None
        durable_key = broker.keys.durable(self.request.agent, self.durable.key)
        # The key names a request through a value the asking side can rewrite: an outcome counts
        # only if it was sealed since this ask could have been waiting for it (its keep: the result
        # TTL or the detach grace, whichever is longer; 10 s of slack for the provider's clock).
        seconds, micros = await broker.commands.call("TIME")
        keep_ms = max(int(broker._provider_settings.result_ttl * 1000), self.durable.grace_ms) + 10_000
        self.settled_after = int(seconds) * 1000 + int(micros) // 1000 - keep_ms
        for _ in range(_ATTACH_TRIES):
            named: str | None = await broker.commands.call("GET", durable_key)
            if named is not None and named in broker._asks:
                raise UserQuestionError(f"key {self.durable.key!r} is being asked already by this process", BAD_REQUEST)
            attach = None if named is None else inbox.expect(named)
            if named is not None:
                broker._attaching[named] = self  # a notice for it meanwhile is checked as this ask's
            try:
                reply = await broker._script(
                    "ask",
                    self.request,
                    self.agent,
                    self.request_id,
                    timeout_ms=timeout_ms,
                    durable=self.durable,
                    named=named,
                    routing=self.routing,
                    wire=self.wire,
                )
            except BaseException:
                if named is not None:
                    inbox.forget(named)
                    # The script may have run (its reply lost with the cancellation): then the hash names this
                    # process, which no longer waits; the withdrawal detaches it (detach.lua checks the client).
                    self.attached_unsure = named
                raise
            finally:
                if named is not None:
                    broker._attaching.pop(named, None)
            if reply[0] == "retry":
                if named is not None:
                    inbox.forget(named)
                continue
            if reply[0] in ("attached", "settled") and named is not None and attach is not None:
                inbox.forget(self.request_id)
                del broker._asks[self.request_id]
                self.request_id, self.future = named, attach
                broker._asks[named] = self
                if reply[0] == "attached" and reply[1] and reply[1] != broker.client_id:
                    self._tell_replaced(reply[1])
            elif named is not None:
                inbox.forget(named)
            return reply
        raise UserQuestionError(
            f"key {self.durable.key!r} changed hands {_ATTACH_TRIES} times while asking", BROKER_UNAVAILABLE
        )

    def _tell_replaced(self, client_id: str) -> None:
        """End the wait of the process this ask re-attached from, should it still wait (a paused one)."""
        keys = self.broker.keys
        error = UserQuestionError("another process re-attached to this keyed question", CALLER_NOT_LIVE).to_payload()
        # '~': an ending for a waiter only; the receiver never cleans the request up on it.
        notice = f"{self.request_id} ~{encode(Outcome(error=error)).decode()}"
        inbox = keys.inbox(client_id)
        self.broker._fire("RPUSH", inbox, notice)
        self.broker._fire("PEXPIRE", inbox, int(self.broker._provider_settings.result_ttl * 1000))

    async def _kept_outcome(self, state: str) -> str | None:
        """The outcome of a keyed request settled while its asker was away (None: not one to accept; wait)."""
        outcome: str | None = await self.broker.commands.call("GET", self.broker.keys.outcome(self.request_id))
        if outcome is None:
            raise UserQuestionError(
                f"request {self.request_id} was {state} while its asker was away, and the outcome has expired",
                ASK_TIMED_OUT,
            )
        return outcome if self.accepts(outcome) else None

    async def end_on_close(self) -> None:
        """The broker closes: withdraw, and end the wait with the outcome if one came first."""
        self.ended_on_close = True
        future = self.future
        if future is None or future.done():
            return
        try:
            outcome = await self._withdraw(future)
        except Exception as error:
            log.warning("could not withdraw request %s on close: %r", self.request_id, error)
            outcome = None
        if not future.done():
            if outcome is not None:
                future.set_result(outcome)
            else:
                future.set_exception(
                    UserQuestionError("the broker was closed while the ask waited", BROKER_UNAVAILABLE)
                )

    async def _withdraw_quietly(self, future: asyncio.Future[str]) -> None:
        try:
            await self._withdraw(future)
        except Exception as error:
            log.warning("could not withdraw request %s: %r (housekeeping reaps it)", self.request_id, error)

    async def _detach(self, request_id: str) -> Any:
        broker, keys = self.broker, self.broker.keys
        settings = broker._provider_settings
        return await broker.commands.script(
            SCRIPTS["detach"],
            [keys.request(request_id), keys.requests, keys.away, keys.asklog],
            [request_id, broker.client_id, settings.audit_maxlen, int(settings.result_ttl * 1000)],
        )

    async def _withdraw(self, future: asyncio.Future[str]) -> str | None:
        """Withdraw the request; if it was settled first, return that outcome instead."""
        settled = _outcome_of(future)
        if settled is not None:
            return settled
        broker = self.broker
        keys = broker.keys
        if self.durable is not None and self.attached_unsure is not None:
            await self._detach(self.attached_unsure)
        if self.durable is not None and self.withdrawal == "withdrawn":
            # A keyed ask is given up only by an abort or a timeout; otherwise it is detached.
            reply = await self._detach(self.request_id)
            if reply[0] != "settled":
                return _outcome_of(future)
            outcome_key = keys.outcome(self.request_id)
            outcome: str | None = await broker.commands.call("GET", outcome_key)
            return outcome if outcome is not None and self.accepts(outcome) else _outcome_of(future)
        reply = await broker.commands.script(
            SCRIPTS["withdraw"],
            [keys.request(self.request_id), keys.requests, keys.asklog],
            [
                self.request_id,
                self.withdrawal,
                f"the asker {self.withdrawal}",
                "providers",
                broker._provider_settings.audit_maxlen,
            ],
        )
        if reply[0] != "settled":
            return _outcome_of(future)
        outcome_key = keys.outcome(self.request_id)
        outcome = await broker.commands.call("GET", outcome_key)
        if outcome is None or not self.accepts(outcome):
            return _outcome_of(future)  # the inbox waiter took the outcome meanwhile
        if broker._commands is not None and broker._open:
            cleanup = [keys.request(self.request_id), outcome_key]
            broker._commands.fire_script(SCRIPTS["settled_cleanup"], cleanup, [TOMBSTONE_MS, broker.client_id])
        return outcome


def _outcome_of(future: asyncio.Future[str]) -> str | None:
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return None


def _settled(outcome: str, decoded: Outcome | None = None) -> AskUserQuestionAnswer:
    """The answer an outcome holds, or its error raised (``decoded``: ``outcome`` already decoded)."""
    decoded = decoded if decoded is not None else decode_outcome(outcome)
    if decoded.error is not None:
        raise UserQuestionError.from_payload(decoded.error)
    if decoded.answer is None:
        raise UserQuestionError("the outcome holds neither an answer nor an error", BROKER_UNAVAILABLE)
    return decoded.answer
