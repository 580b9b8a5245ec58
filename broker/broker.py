"""The broker: ``ask()`` for agents, ``provider()`` for UIs, over one Redis namespace."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import msgspec
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from . import _scripts as scripts
from ._ask import DEFAULT_ROUTING, Answerer, AskState, Next, _Ask, _Durable, _durable, _Routing, ask_script, routing_of
from ._commands import Commands
from ._ids import UniqueIds
from ._inbox import Inbox
from ._keys import TOMBSTONE_MS, Keys
from ._redis_errors import describe, unavailable
from ._tasks import Background, running
from .agents import Agent
from .attachments import read_attachment, write_attachment
from .connection import redis_from_url
from .decisions import (
    Decision,
    list_decisions,
    revoke_decision,
)
from .errors import (
    ASK_ABORTED,
    BAD_REQUEST,
    BROKER_UNAVAILABLE,
    CALLER_NOT_LIVE,
    EMPTY_QUESTIONS,
    NO_SIGNING_KEY,
    NO_TRUSTED_KEY,
    UserQuestionError,
)
from .housekeeping import housekeep_while_unattended
from .lease import HANDOVER_GRACE, acquire_lease, release_lease
from .provider import Provider, ProviderSettings
from .signing import SigningKey, TrustedKeys
from .types import AskUserQuestionAnswer, AskUserQuestionRequest, decode_outcome
from .validation import Limits, check_request

__all__ = ["Answerer", "Broker", "Next"]

log = logging.getLogger(__name__)

_Client = Redis | RedisCluster
_CLEANUP_BATCH = 500
"""requests cleaned up in one settled_cleanup.lua call at most"""
_CLOSE_GRACE = 5.0
"""seconds closing waits for Redis to take the asks' ends and the queued commands (docs/reliability.md 7)"""


@dataclass(frozen=True)
class _Registration:
    answerer: Answerer
    agent_id: str | None


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

    ``attest_key`` (a gateway's own key, never an answering one) attests each ask this broker
    enqueues: request, agent and process. ``gateway_keys`` are the gateways' public keys a
    provider pins: an ask one of them attested shows its agent id as verified, any other as
    claimed (``PendingRequest.verified``).
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
        attest_key: SigningKey | str | None = None,
        gateway_keys: TrustedKeys | Iterable[str] | str = (),
        housekeeping_every: float | None = 3.0,
    ) -> None:
        self.keys = Keys(namespace)
        if isinstance(trusted_keys, str):
            trusted_keys = TrustedKeys.parse(trusted_keys)
        # A copy: adding this broker's own key below must not make another broker sharing the object trust it.
        self.trusted_keys = TrustedKeys(trusted_keys.keys if isinstance(trusted_keys, TrustedKeys) else trusted_keys)
        self.signing_key = SigningKey.from_text(signing_key) if isinstance(signing_key, str) else signing_key
        if self.signing_key is not None:
            self.trusted_keys.add(self.signing_key)
        self.attest_key = SigningKey.from_text(attest_key) if isinstance(attest_key, str) else attest_key
        if self.attest_key is not None and self.attest_key.id in self.trusted_keys.ids:
            # Whoever holds a key answers trust could sign answers: a gateway must never hold one.
            raise UserQuestionError("the gateway key must not be a key answers are signed with", BAD_REQUEST)
        if isinstance(gateway_keys, str):
            gateway_keys = TrustedKeys.parse(gateway_keys)
        gateways = TrustedKeys(gateway_keys.keys if isinstance(gateway_keys, TrustedKeys) else gateway_keys)
        self.gateway_keys = gateways
        """the pinned gateways' public keys: an ask one of them attested shows a verified agent id"""
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
        self.housekeeping_every = housekeeping_every
        """while a provider of this broker holds the lease and no maintenance worker is alive, it reaps, expires
        and ends away asks this often (seconds); None: never (leave it to ``qbroker worker``)"""
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
            gateway_keys=gateways,
        )
        self._answerers: list[_Registration] = []
        self._agents: dict[str, Agent] = {}
        self._last_checkpoint: str | None = None
        """the audit checkpoint this broker's providers wrote last: the next one names it (a lost audit shows)"""
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _CLOSE_GRACE  # one for every step: with Redis gone each would wait it out
        try:
            async with asyncio.timeout_at(deadline):
                asks = list(self._asks.values())
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
            scripts.settled_cleanup(self._commands, settled=keys, tombstone=TOMBSTONE_MS, client=self.client_id)

    @property
    def _open_commands(self) -> Commands | None:
        """The commands a clean-up nobody waits for goes through; None once the broker is closed (it is dropped)."""
        return self._commands if self._open else None

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
            refused = await agent.register(commands, self.keys, self.agent_ttl)
        except (RedisError, OSError) as error:
            raise unavailable(error, "registering the agent") from error
        if refused is not None:
            raise refused.error()
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
        return await self._ask(request, agent, abort, timeout, durable, routing_of(remember, coalesce))

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
        request, durable, routing = self._as_agent(agent, request, key, detach_grace, remember, coalesce)
        return await self._ask(request, agent, abort, timeout, durable, routing)

    def _as_agent(
        self,
        agent: Agent,
        request: AskUserQuestionRequest,
        key: str | None,
        detach_grace: float | None,
        remember: bool,
        coalesce: bool,
    ) -> tuple[AskUserQuestionRequest, _Durable | None, _Routing]:
        """``ask_as``'s request (its agent set), durability and routing (``Agent.ask`` calls ``_ask`` with them
        itself: every coroutine between a waiting ask and its caller is a frame kept per waiting ask)."""
        if request.agent != agent.id:
            request = msgspec.structs.replace(request, agent=agent.id)
        return request, _durable(key, detach_grace, self.detach_grace), routing_of(remember, coalesce)

    async def _ask(
        self,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        abort: asyncio.Event | None,
        timeout: float | None,
        durable: _Durable | None = None,
        routing: _Routing = DEFAULT_ROUTING,
    ) -> AskUserQuestionAnswer:
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        if not self.trusted_keys:
            raise UserQuestionError(
                "this asker trusts no answering key, so no answer could count: give it the providers' public key "
                "(qbroker: --trusted-keys-file FILE or QBROKER_TRUSTED_KEYS_FILE; Python: Broker(trusted_keys=...))",
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
        # One frame, not a wrapper awaiting the checks and the ask: each is kept per waiting ask.
        try:
            if agent is not None and (problem is not None or answerers):
                await self._gate(request, agent)  # the seeds' order: the caller gate first
            if problem is not None:
                raise problem
            ask = _Ask(self, request, agent, deadline, durable, routing)
            try:
                return await ask.ask(answerers, abort)
            finally:
                ask._to(AskState.ENDED)
        except (RedisError, OSError) as error:  # a refusal no retry can mend (NOPERM, say)
            raise unavailable(error, "asking") from error

    async def _gate(self, request: AskUserQuestionRequest, agent: Agent) -> None:
        reply = await ask_script(self, request, agent, "", gate_only=True)
        if isinstance(reply, scripts.Refusal):
            raise reply.error()

    # -- attachments ----------------------------------------------------------------------

    async def attach(self, text: str) -> str:
        """Keep ``text`` (at most 4 MB of UTF-8) for ``request_ttl`` under its SHA-256, returned as hex.

        A question names it (``AskUserQuestionItem.attachment``) where it shows the text cut; a page
        fetches it when the human asks to see it all.
        """
        return await write_attachment(self.commands, self.keys, text, self.request_ttl)

    async def attachment(self, digest: str) -> str | None:
        """The attached text named ``digest``; None when it expired or its bytes do not hash to ``digest``."""
        return await read_attachment(self.commands, self.keys, digest)

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

    async def request_handover(
        self, to: str, *, by: str, ttl: float | None = None, grace: float = HANDOVER_GRACE
    ) -> None:
        """Ask the lease holder to hand the namespace's lease to provider ``to`` (standing by), for ``by``.

        The holder sees it at its next renewal (within a third of the lease TTL): its iteration ends,
        and leaving its ``provider()`` block releases the lease. A holder with a question open gives its person
        ``grace`` seconds (``Handover.grace``) to finish it, then hands over anyway, the question still pending
        (handing over never answers). Meanwhile, and for ``ttl`` seconds at most (default: three lease TTLs, at
        least 30 s, and past the grace), only ``to`` may take the lease, so the holder standing by again does not
        take it back. Needs the answering side's Redis user.
        """
        if not to or "\n" in to:
            raise UserQuestionError("a handover names the provider to take the lease, on one line", BAD_REQUEST)
        if not 0 < grace <= 3600:
            raise UserQuestionError("a handover's grace is more than 0 and at most 3600 seconds", BAD_REQUEST)
        default = max(30.0, 3 * self.lease_ttl, self.lease_ttl + grace + 10)
        ttl_ms = int((ttl if ttl is not None else default) * 1000)
        if ttl_ms <= 0:
            raise UserQuestionError("a handover's ttl is positive", BAD_REQUEST)
        who = " ".join(by.split())[:200]
        try:
            await self.commands.call("SET", self.keys.handover, f"{to}\n{who}\n{int(grace * 1000)}", "PX", ttl_ms)
        except (RedisError, OSError) as error:
            raise unavailable(error, "asking for a handover") from error

    def handover_within(self, grace: float = HANDOVER_GRACE) -> float:
        """How long a handover asked now takes at most, as far as this broker can tell: the holder's next renewal
        (a third of the lease TTL, its own TTL assumed to be this one), the grace a question open there gets, and
        another third for the holder to let go and this side to take the lease."""
        return 2 * self.lease_ttl / 3 + grace

    @asynccontextmanager
    async def provider(
        self,
        name: str,
        *,
        standby: bool = True,
        on_standby: Callable[[str], Any] | None = None,
        coalesce: bool = True,
        automatic: bool = False,
    ) -> AsyncIterator[Provider]:
        """Hold the namespace's provider lease for the block (waiting for it when ``standby``).

        ``coalesce=False``: present every request on its own, never identical requests of several
        askers as one (a policy that decides by the asking agent must see each asker).

        ``automatic=True``: this provider answers by rule, not a person (``qbroker auto``): its settlements
        stay out of the audit's human record (docs/security.md), where askers could drive their volume.

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
                last_checkpoint=self._last_checkpoint,
            )
            log.info("provider %s holds the lease of %s (epoch %d)", name, self.namespace, epoch)
            try:
                if automatic:  # before its first read: every settlement of this epoch is told apart
                    await commands.call("SET", self.keys.audit_automatic, epoch)
                work: list[Callable[[], Coroutine[Any, Any, None]]] = []
                every = self.housekeeping_every
                if every is not None:

                    async def housekeeping() -> None:
                        await housekeep_while_unattended(self, provider, every)

                    work.append(housekeeping)
                async with provider, running(*work):
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
                self._last_checkpoint = provider.last_checkpoint
        finally:
            await blocking.aclose()
