"""The broker: ``ask()`` for agents, ``provider()`` for UIs, over one Redis namespace."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, overload

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from ._commands import Commands
from ._keys import Keys
from ._redis_errors import unavailable
from ._tasks import running
from .answering.lease import HANDOVER_GRACE, acquire_lease, release_lease
from .answering.provider import Provider, ProviderSettings
from .asking._call import ask, for_agent
from .asking._core import Answerer, AskingCore, Next, Registration
from .asking.agents import Agent
from .attachments import read_attachment, write_attachment
from .decisions import Decision, list_decisions, revoke_decision
from .errors import BAD_REQUEST, NO_SIGNING_KEY, UserQuestionError
from .operating.housekeeping import housekeep_while_unattended
from .settings import BrokerSettings, Trust
from .signing import SigningKey, TrustedKeys
from .types import AskUserQuestionAnswer, AskUserQuestionRequest
from .validation import Limits

if TYPE_CHECKING:
    from typing import Unpack

    from .asking.options import AskOptions

__all__ = ["Answerer", "Broker", "Next"]

log = logging.getLogger(__name__)

_Client = Redis | RedisCluster
_T = TypeVar("_T")


class _Part(Generic[_T]):
    """A read-only attribute of the broker that one of its parts holds (``lease_ttl`` is ``settings.lease_ttl``)."""

    def __init__(self, part: str) -> None:
        self.part = part
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: type) -> _T: ...
    def __get__(self, instance: object, owner: type) -> _T | Self:
        if instance is None:
            return self
        value: _T = getattr(getattr(instance, self.part), self.name)
        return value


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
        self.settings = BrokerSettings(
            namespace=namespace,
            lease_ttl=lease_ttl,
            agent_ttl=agent_ttl,
            client_ttl=client_ttl,
            request_ttl=request_ttl,
            result_ttl=result_ttl,
            audit_maxlen=audit_maxlen,
            dead_maxlen=dead_maxlen,
            unavailable_after=unavailable_after,
            connect_timeout=connect_timeout,
            sweep_every=sweep_every,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            detach_grace=detach_grace,
            limits=limits or Limits(),
            housekeeping_every=housekeeping_every,
        )
        """this broker's settings (frozen)"""
        self.trust = Trust.of(trusted_keys, signing_key, attest_key, gateway_keys)
        """whose signatures count here, and what this broker signs and attests with"""
        self._core = AskingCore(self.settings, self.trust, url, connect)
        self._agents: dict[str, Agent] = {}
        self._last_checkpoint: str | None = None
        """the audit checkpoint this broker's providers wrote last: the next one names it (a lost audit shows)"""

    def __repr__(self) -> str:  # the URL may carry a password
        return f"Broker(namespace={self.namespace!r}, client_id={self.client_id!r})"

    # -- what it is (read-only: the settings, keys and counters it holds) ---------------------

    namespace = _Part[str]("settings")
    lease_ttl = _Part[float]("settings")
    agent_ttl = _Part[float]("settings")
    client_ttl = _Part[float]("settings")
    request_ttl = _Part[float]("settings")
    limits = _Part[Limits]("settings")
    unavailable_after = _Part[float]("settings")
    connect_timeout = _Part[float]("settings")
    sweep_every = _Part[float]("settings")
    detach_grace = _Part[float]("settings")
    housekeeping_every = _Part[float | None]("settings")
    trusted_keys = _Part[TrustedKeys]("trust")
    signing_key = _Part[SigningKey | None]("trust")
    attest_key = _Part[SigningKey | None]("trust")
    gateway_keys = _Part[TrustedKeys]("trust")
    keys = _Part[Keys]("_core")
    client_id = _Part[str]("_core")
    """this process's asking client: its inbox and liveness key are named by it"""
    commands = _Part[Commands]("_core")
    """the namespace's commands pipeline (``BROKER_UNAVAILABLE`` while the broker is not open)"""
    rejected_outcomes = _Part[int]("_core")
    """answers (and remembered decisions) refused because no trusted key signed them for their request"""
    remembered_answers = _Part[int]("_core")
    """asks answered at once by remembered decisions (verified), not by a human asked now"""
    last_remembered_by = _Part[tuple[str, ...]]("_core")
    """who set the decisions of the latest such answer (their signed ``by``), for a one-ask tool to say so"""

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Broker:
        await self._core.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close: every ask still waiting ends (withdrawn, or with its outcome if one came first)."""
        await self._core.aclose()

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
        agent = Agent(self._core, agent_id, owner_id, restart=restart)
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
        registration = Registration(answerer, agent.id if isinstance(agent, Agent) else agent)
        if prepend:
            self._core.answerers.insert(0, registration)
        else:
            self._core.answerers.append(registration)

        def dispose() -> None:
            if registration in self._core.answerers:
                self._core.answerers.remove(registration)

        return dispose

    # -- asking ---------------------------------------------------------------------

    async def ask(self, request: AskUserQuestionRequest, **options: Unpack[AskOptions]) -> AskUserQuestionAnswer:
        """Ask a human; ``request.agent`` is an agent registered by this broker (its id or the instance).

        ``abort`` (an event) withdraws the question when set; ``timeout`` (seconds) withdraws it unanswered.
        ``key`` names the question durably (per namespace and asking agent id): if this process
        stops, the question stays pending for ``detach_grace`` seconds (the broker's by default),
        and a new live instance asking the same request with the same key re-attaches to it.
        A remembered decision that matches every question answers at once; ``remember=False``
        always asks a human (and no provider may remember the answer). Identical pending requests
        of several askers are presented once and settled by one answer; ``coalesce=False`` keeps
        this one apart (``broker.asking.options.AskOptions``).
        """
        named: object = request.agent
        if isinstance(named, Agent):
            waiting = ask(self._core, for_agent(request, named), named, options)  # as ask_as() does
        elif named is not None and not isinstance(named, str):
            raise UserQuestionError(
                f"request.agent must be an agent id or an Agent, not {type(named).__name__}", BAD_REQUEST
            )
        else:
            waiting = ask(self._core, request, self._agents.get(named) if named is not None else None, options)
        del request, options, named  # not kept while the ask waits (a waiting ask's memory counts)
        return await waiting

    async def ask_as(
        self, agent: Agent, request: AskUserQuestionRequest, **options: Unpack[AskOptions]
    ) -> AskUserQuestionAnswer:
        """Ask as ``agent`` (``request.agent`` is set to its id); ``options`` as ``ask()``'s."""
        waiting = ask(self._core, for_agent(request, agent), agent, options)
        del request, options  # not kept while the ask waits (a waiting ask's memory counts)
        return await waiting

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
            self.commands, self.keys, decision_id, by=by, audit_maxlen=self.settings.audit_maxlen
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
        settings = _provider_settings(self.settings, self.trust)
        blocking = self._core.connect_blocking()
        try:
            try:
                # The Redis clock, read once: answers are sealed with when they were given (by it).
                seconds, micros = await commands.call("TIME")
                token, epoch = await acquire_lease(
                    commands=commands,
                    blocking=blocking,
                    keys=self.keys,
                    name=name,
                    settings=settings,
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
                settings=settings,
                signing_key=self.signing_key,
                redis_ms=int(seconds) * 1000 + int(micros) // 1000,
                coalesce=coalesce,
                last_checkpoint=self._last_checkpoint,
            )
            log.info("provider %s holds the lease of %s (epoch %d)", name, self.namespace, epoch)
            try:
                if automatic:  # before its first read: every settlement of this epoch is told apart
                    await commands.call("SET", self.keys.audit_automatic, epoch)
                async with provider, running(*self._provider_work(provider)):
                    yield provider
            finally:
                await self._let_go(provider)
        finally:
            await blocking.aclose()

    def _provider_work(self, provider: Provider) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """What runs beside ``provider``'s own loops while it holds the lease: this broker's housekeeping."""
        work: list[Callable[[], Coroutine[Any, Any, None]]] = []
        every = self.housekeeping_every
        if every is not None:

            async def housekeeping() -> None:
                await housekeep_while_unattended(self, provider, every)

            work.append(housekeeping)
        return work

    async def _let_go(self, provider: Provider) -> None:
        """Seal what ``provider`` leaves behind and release its lease (bounded: past its TTL it lapses anyway)."""
        try:
            async with asyncio.timeout(self.lease_ttl):
                if not provider.lost:
                    await provider.checkpoint()  # seal what this provider leaves behind
                await release_lease(self.commands, self.keys, provider)
        except Exception as error:
            log.warning("could not release the lease: %r (it lapses after its TTL)", error)
        self._last_checkpoint = provider.last_checkpoint


def _provider_settings(settings: BrokerSettings, trust: Trust) -> ProviderSettings:
    """What a provider of a broker with ``settings`` and ``trust`` runs by."""
    return ProviderSettings(
        lease_ttl=settings.lease_ttl,
        result_ttl=settings.result_ttl,
        audit_maxlen=settings.audit_maxlen,
        dead_maxlen=settings.dead_maxlen,
        limits=settings.limits,
        min_replicas=settings.min_replicas,
        replica_timeout=settings.replica_timeout,
        liveness_grace=settings.liveness_grace,
        gateway_keys=trust.gateway_keys,
    )
