"""The provider side: one lease holder per namespace, fenced, with standbys.

A provider holds the namespace's lease (a fencing epoch plus its own token) and renews it
in the background; standbys block until the lease is released or lapses. Every action a
provider takes on a request is a script that first checks the lease, so a provider that
stalled past its lease (GC, SIGSTOP, partition) cannot answer when it wakes up.

The holder's reads follow the client's rules (docs/architecture.md): a blocking read is never
re-sent and has a reply deadline; after a broken read the holder claims its own pending list
again, and every ``reclaim_every`` seconds it claims entries that sat idle in any consumer's
pending list (a fenced reader may have taken them after the holder's last claim). No Redis
failure ends the reader: it waits the failure out until the lease is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError, ResponseError

from . import _scripts as scripts
from . import audit
from ._commands import Commands
from ._ids import UniqueIds
from ._keys import GROUP, Keys
from ._members import Members
from ._redis_errors import is_transient, unavailable
from ._schedule import Lineup, Schedule, request_fingerprint
from ._scripts import Delivering, Refusal, Reply, Settlement
from .backoff import Backoff
from .decisions import Remember, check_remember, settle_extension, why_not_rememberable
from .errors import (
    ASK_CANCELLED,
    BROKER_UNAVAILABLE,
    DUPLICATE_PROVIDER,
    LEASE_LOST,
    NOT_PENDING,
    UserQuestionError,
)
from .signing import Seal, SigningKey, TrustedKeys, seal_outcomes
from .types import PRIORITIES, AskUserQuestionAnswer, AskUserQuestionRequest, Outcome, decode_request, encode
from .validation import Limits, check_answer, check_request

__all__ = ["HANDOVER_GRACE", "Asker", "Handover", "PendingRequest", "Provider", "ProviderSettings"]

log = logging.getLogger(__name__)

_READ_COUNT = 256
_SETTLE_BATCH = 256
"""settlements sent in one settle.lua call at most"""
_REPLY_MARGIN_S = 3.0
"""how long past its block a blocking read's reply may be late before the connection counts as silent"""
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
HANDOVER_GRACE = 15.0
"""seconds a holder with a question open gives its person to finish it once a handover is asked, by default
(``Broker.request_handover``); then it hands over anyway, the question still pending"""
_NOTICES = ("withdraw", "away", "back")
"""stream entries that are notices about a request, not asks"""


@dataclass(frozen=True, kw_only=True)
class ProviderSettings:
    lease_ttl: float
    result_ttl: float
    audit_maxlen: int
    dead_maxlen: int
    limits: Limits
    min_replicas: int = 0
    replica_timeout: float = 1.0
    liveness_grace: float = 0.0
    """after a Redis start, how long askers have to beat again before any is judged gone"""
    gateway_keys: TrustedKeys | None = None
    """the pinned gateway public keys: an ask they attested shows its agent id as verified"""

    @property
    def block_s(self) -> float:
        """How long one blocking read of a provider or standby blocks."""
        return max(0.1, self.lease_ttl / 4)

    @property
    def reclaim_every(self) -> float:
        """How often the holder claims entries idle in any consumer's pending list."""
        return max(0.2, self.lease_ttl / 2)


_Settlement = tuple[Settlement, Seal]
"""one settlement's part of a settle.lua call, and what seals its outcome"""
_CARRIED = -1
"""settle.lua's D for a coalesced card's later asker: the card's decisions go with it when the first asker's
request was no longer pending"""


class Handover(NamedTuple):
    """Another provider asked for the lease (``Broker.request_handover``)."""

    to: str
    """the provider's name: the lease is kept for it once this holder lets go"""
    by: str
    """who asked (a person signed in to a page, say)"""
    grace: float = HANDOVER_GRACE
    """seconds a question open here may take to finish before this holder hands over anyway, leaving it pending"""


class Asker(NamedTuple):
    """One asker of a (possibly coalesced) pending request."""

    agent_id: str | None
    request_id: str
    verified: bool = False
    """its agent id was attested by a pinned gateway for this very request; else only claimed"""


@dataclass(eq=False, kw_only=True, slots=True)
class _Member:
    """One asker's request inside a card."""

    request_id: str
    request: AskUserQuestionRequest
    request_sha: str
    """SHA-256 (hex) of the request JSON as asked: the asker's answer is sealed to it"""
    durable: str
    """the key it was asked with ('' for none): a keyed asker's answer is sealed to it"""
    client_id: str
    created_ms: int
    entry_id: str
    away: bool = False
    opted_out: bool = False
    attestation: str = ""
    """the gateway's attestation the ask's stream entry carried ('' for none)"""
    verified: bool = False
    """``attestation`` verifies for this request, its agent and the process it is bound to now"""


class PendingRequest:
    """A request delivered to this provider, waiting for a human's answer.

    Identical requests of several askers are one ``PendingRequest`` (a card): ``askers`` lists
    them, one answer or cancel settles each with its own ids, and an asker that withdraws only
    leaves the card. ``request_id`` and ``request`` are the first asker's, kept while the card lives.
    """

    __slots__ = (  # a web page's server holds 100 000 of these: no __dict__ each
        "_changed",
        "_fingerprint",
        "_handed_out",
        "_members",
        "_provider",
        "_settling",
        "_shown_askers",
        "_withdrawn",
        "agent_id",
        "created_ms",
        "deadline_ms",
        "entry_id",
        "request",
        "request_id",
    )

    def __init__(
        self,
        provider: Provider,
        *,
        request_id: str,
        request: AskUserQuestionRequest,
        request_sha: str,
        client_id: str,
        created_ms: int,
        durable: str = "",
        entry_id: str = "",
        asker_away: bool = False,
        opted_out: bool = False,
        attestation: str = "",
        deadline_ms: int | None = None,
    ) -> None:
        self._provider = provider
        self.entry_id = entry_id
        self.request_id = request_id
        self.request = request
        self.agent_id = request.agent
        self.created_ms = created_ms
        """when the request was asked, unix milliseconds by the Redis clock"""
        self.deadline_ms = deadline_ms
        """when its first asker stops waiting (its timeout), unix milliseconds by the Redis clock, as delivered;
        None: it waits for as long as the request lives"""
        self._members = Members(
            _Member(
                request_id=request_id,
                request=request,
                request_sha=request_sha,
                durable=durable,
                client_id=client_id,
                created_ms=created_ms,
                entry_id=entry_id,
                away=asker_away,
                opted_out=opted_out,
                attestation=attestation,
            )
        )
        self._withdrawn: asyncio.Event | None = None
        self._changed: asyncio.Event | None = None
        self._handed_out = False
        self._settling = False
        self._fingerprint = ""
        """what identical requests of other askers share, '' when it takes no other asker"""
        self._shown_askers = 0
        """how many of its askers the provider shows it for (its card goes with the last)"""

    def __repr__(self) -> str:
        return f"PendingRequest(request_id={self.request_id!r}, agent_id={self.agent_id!r})"

    @property
    def withdrawn(self) -> asyncio.Event:
        """Set when every asker withdrew the request (the UI takes it down)."""
        if self._withdrawn is None:  # made when first used: two Events were 1.5 KB of every pending card
            self._withdrawn = asyncio.Event()
        return self._withdrawn

    @property
    def changed(self) -> asyncio.Event:
        """Set when ``asker_away``, ``askers`` or ``priority`` change (a UI clears it, then shows the request again)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    @property
    def is_withdrawn(self) -> bool:
        """Whether ``withdrawn`` is set; reading it makes no Event (one was 760 B of every card a web page showed)."""
        return self._withdrawn is not None and self._withdrawn.is_set()

    @property
    def askers(self) -> tuple[Asker, ...]:
        """Every asker this card stands for (agent id, request id), the first asker first."""
        return tuple(Asker(member.request.agent, member.request_id, member.verified) for member in self._members)

    @property
    def verified(self) -> bool:
        """Every asker's agent id was attested by a pinned gateway for its request; else it is only claimed."""
        return all(member.verified for member in self._members)

    @property
    def priority(self) -> str:
        """The most urgent of its askers' priorities: "urgent", "normal" or "low"."""
        return PRIORITIES[self.level]

    @property
    def level(self) -> int:
        return self._members.level

    @property
    def asker_away(self) -> bool:
        """Every asker stopped (keyed requests): it can still be answered, and is kept for their return."""
        return self._members.away == len(self._members)

    @property
    def opted_out(self) -> bool:
        """An asker asked for a human every time (``ask(..., remember=False)``): nothing is remembered."""
        return self._members.opted_out > 0

    @property
    def rememberable(self) -> bool:
        """False when the asker opted out of remembered decisions (``ask(..., remember=False)``)."""
        return not self.opted_out

    def can_remember(self, answer: AskUserQuestionAnswer, scope: str = "namespace") -> bool:
        """Whether ``answer`` (checked) could be remembered in ``scope`` (a UI offers it only then)."""
        remember = Remember(scope="agent" if scope == "agent" else "namespace")
        return why_not_rememberable(self.request, answer, remember, opted_out=self.opted_out) is None

    async def answer(
        self, answer: AskUserQuestionAnswer, *, by: str = "", remember: Remember | None = None
    ) -> AskUserQuestionAnswer:
        """Settle with ``answer``; ``BAD_ANSWER`` leaves the request pending. Returns it as sent.

        ``remember`` also stores the answer as a decision for later identical questions (this
        agent's or the whole namespace's), atomically with the settlement; an answer that cannot
        be remembered (free text, a skip, an asker that opted out) is refused with ``BAD_ANSWER``.
        Every asker of a coalesced card gets the answer under its own question ids.
        """
        accepted = check_answer(self.request, answer, self._provider.settings.limits)
        if remember is not None:
            check_remember(self.request, accepted, remember, opted_out=self.opted_out)
        await self._settle("answered", by, accepted, remember)
        return accepted

    async def cancel(self, message: str = "the human dismissed the question", *, by: str = "") -> None:
        """Settle as dismissed: every asker gets ``ASK_CANCELLED``."""
        error = UserQuestionError(message, ASK_CANCELLED)
        await self._settle("cancelled", by, error=encode(Outcome(error=error.to_payload())).decode())

    def _join(self, member: _Member) -> None:
        self._members.add(member)
        self._set_changed()

    def _leave(self, request_id: str) -> bool:
        """Drop one asker; True when it was the last (kept: settling the card is then NOT_PENDING)."""
        if self._members.get(request_id) is None:
            return False
        if len(self._members) == 1:
            return True
        self._members.remove(request_id)
        self._set_changed()
        return False

    def _set_changed(self) -> None:
        self.changed.set()
        self._provider._note_change(self)

    def _set_withdrawn(self) -> None:
        self.withdrawn.set()
        self._provider._note_change(self)

    def _member(self, request_id: str) -> _Member | None:
        return self._members.get(request_id)

    async def _settle(
        self,
        state: str,
        by: str,
        answer: AskUserQuestionAnswer | None = None,
        remember: Remember | None = None,
        error: str = "",
    ) -> None:
        members = list(self._members)
        self._settling = True  # an identical request arriving now gets a card of its own
        try:
            now_ms = 0
            if remember is not None:  # a decision's signed expiry is counted by the Redis clock
                seconds, micros = await self._provider.commands.call("TIME")
                now_ms = int(seconds) * 1000 + int(micros) // 1000
            settlements = []
            by_ids: dict[tuple[str, ...], tuple[AskUserQuestionAnswer, str]] = {}
            """the answer and its outcome JSON under each set of question ids: a card's askers mostly share one"""
            for member in members:
                outcome = error
                extra_keys: list[str] = []
                extra_args: list[Any] = [0]
                if answer is not None:
                    ids = tuple(question.id for question in member.request.questions)
                    if (known := by_ids.get(ids)) is None:
                        own = _with_ids_of(answer, self.request, member.request)
                        known = by_ids[ids] = (own, encode(Outcome(answer=own)).decode())
                    own, outcome = known
                    if remember is not None and (member is members[0] or remember.scope == "agent"):
                        extra_keys, extra_args = _remembering(self._provider, member.request, own, remember, now_ms, by)
                    elif remember is not None:
                        extra_args = [_CARRIED]  # settle.lua writes the first asker's decisions with it if need be
                settlements.append(self._settlement(member, state, outcome, by, extra_keys, extra_args))
            try:
                replies = await self._provider.settle_all(settlements)
            except (RedisError, OSError) as failure:
                raise unavailable(failure, "settling the request") from failure
        finally:
            self._settling = False
        await self._settled(members, settlements, replies)

    def _settlement(
        self, member: _Member, state: str, outcome: str, by: str, extra_keys: list[str], extra_args: list[Any]
    ) -> _Settlement:
        keys, request_id = self._provider.keys, member.request_id
        request_key = keys.request(request_id)
        return (
            Settlement(
                request=request_key,
                outcome_key=keys.outcome(request_id),
                inbox=keys.inbox(member.client_id),
                durable=keys.durable(member.request.agent, member.durable) if member.durable else request_key,
                decision_keys=extra_keys,
                rid=member.request_id,
                state=state,
                outcome=outcome,
                by=by,
                call=self._provider.settle_call_ids.next(),
                asker="verified" if member.verified else "claimed",
                asked=audit.asked_of(member.request),
                decisions=extra_args,
            ),
            Seal(
                request_id,
                member.request_sha,
                member.request.agent or "",
                member.client_id,
                by,
                outcome,
                member.durable,
            ),
        )

    async def _settled(
        self, members: list[_Member], settlements: list[_Settlement], replies: list[Reply | Refusal]
    ) -> None:
        """Forget the settled askers (and those already gone); raise when none was settled here."""
        provider = self._provider
        refused: UserQuestionError | None = None
        settled: list[tuple[_Member, str]] = []
        tell: list[tuple[_Member, str, str]] = []
        """settled askers still to be told: (member, outcome, the client the request hash names)"""
        for member, (settlement, _), reply in zip(members, settlements, replies, strict=True):
            if isinstance(reply, Reply):  # 'ok'
                settled.append((member, settlement.outcome))
                if reply.value:
                    tell.append((member, settlement.outcome, reply.value))
                provider.forget(member.request_id)
                continue
            if reply.code == LEASE_LOST:
                provider.fenced()
                raise reply.error()
            if reply.code == NOT_PENDING:  # withdrawn, lapsed or settled meanwhile: it leaves the card
                shown = provider._shown.get(member.request_id) is self
                provider.forget(member.request_id)
                if shown and self._leave(member.request_id):
                    self._set_withdrawn()  # its last asker: the UI takes the card down
            refused = refused or reply.error()
        if refused is not None and (not settled or refused.code != NOT_PENDING):
            raise refused
        settings = provider.settings
        # With min_replicas settle.lua held the askers' notices back: tell them only once replicas have it.
        if (
            settings.min_replicas
            and settled
            and not await replicated(provider.commands, settings, f"the answer to {self.request_id}")
        ):
            raise UserQuestionError(
                f"request {self.request_id} is settled, but fewer than {settings.min_replicas} replicas"
                " confirmed it; the asker is told once they do",
                BROKER_UNAVAILABLE,
            )
        # Only the askers the hash names as waiting (never an away or detached one: settle.lua knows).
        for member, outcome, client in tell:
            inbox = provider.keys.inbox(client)
            await provider.commands.call("RPUSH", inbox, f"{member.request_id} {outcome}")
            await provider.commands.call("PEXPIRE", inbox, int(settings.result_ttl * 1000))


def _with_ids_of(
    answer: AskUserQuestionAnswer, shown: AskUserQuestionRequest, asked: AskUserQuestionRequest
) -> AskUserQuestionAnswer:
    """The answer to the request shown, under the question ids of an identical request ``asked``."""
    if asked is shown:
        return answer
    ids = {mine.id: theirs.id for mine, theirs in zip(shown.questions, asked.questions, strict=True)}
    return AskUserQuestionAnswer(
        answers=tuple(msgspec.structs.replace(item, id=ids[item.id]) for item in answer.answers)
    )


def _remembering(
    provider: Provider,
    request: AskUserQuestionRequest,
    answer: AskUserQuestionAnswer,
    remember: Remember,
    now_ms: int,
    by: str,
) -> tuple[list[str], list[Any]]:
    if remember.scope == "agent" and not request.agent:
        return [], [0]  # an agentless asker of a coalesced card: agent scope has no agent to remember for
    return settle_extension(
        provider.keys, request, answer, remember, signing_key=provider._signing_key, now_ms=now_ms, by=by
    )


class Provider:
    """The namespace's active provider: iterate it for the requests to present."""

    def __init__(
        self,
        *,
        keys: Keys,
        name: str,
        token: str,
        epoch: int,
        commands: Commands,
        blocking: Redis | RedisCluster,
        settings: ProviderSettings,
        signing_key: SigningKey,
        redis_ms: int = 0,
        coalesce: bool = True,
        last_checkpoint: str | None = None,
    ) -> None:
        self.keys = keys
        self._signing_key = signing_key
        self._clock = (redis_ms, asyncio.get_running_loop().time())
        """the Redis clock (unix ms) read when the provider started, and the loop's time then"""
        self.coalesce = coalesce
        """False: every request is its own card (``Broker.provider(..., coalesce=False)``)"""
        self.name = name
        self.epoch = epoch
        self.token = token
        self.fence = f"{epoch}:{token}:"
        self.commands = commands
        self.settings = settings
        self.consumer = f"{name}:{token[:12]}"
        self._blocking = blocking
        self._schedule: Schedule[PendingRequest] = Schedule()
        """the cards not yet handed out, in the order ``__anext__`` hands them out"""
        self._lineup: Lineup[PendingRequest] = Lineup()
        """the live cards in ``pending``'s order"""
        self._wake = asyncio.Event()
        self._settles: list[tuple[Settlement, Seal, asyncio.Future[Reply | Refusal]]] = []
        self._settler: asyncio.Future[None] | None = None
        self.settle_call_ids = UniqueIds()
        """one per settle.lua settlement, so that a retry after a lost reply recognises its own"""
        self._cards: dict[str, PendingRequest] = {}
        """the live cards, by card id (their first asker's request id)"""
        self._shown: dict[str, PendingRequest] = {}
        """every asker's request id -> its card"""
        self._coalescing: dict[str, PendingRequest] = {}
        """request fingerprint -> the card identical requests join"""
        self._delivering: set[str] = set()
        self._claiming_backlog = False
        """the whole pending list is being claimed (``_claim_backlog``): a reclaim meanwhile would claim and parse
        again what it is about to deliver (a take-over of 100 000)"""
        self._lost = asyncio.Event()
        self.checkpoint_every = audit.CHECKPOINT_EVERY
        """seconds between audit checkpoints while the audit moves"""
        self._checkpoint = last_checkpoint
        """the entry id of the audit checkpoint this process wrote last (a provider before this one of its broker
        passes it on): each checkpoint names it (``after``), so one that finds it gone tells of a lost audit"""
        self.handover: Handover | None = None
        self._handover_asked = asyncio.Event()
        """set once another provider asked for the lease: iterating ends (what was handed out may still be
        settled), and leaving the ``Broker.provider()`` block hands the lease to it"""
        self._changes: dict[PendingRequest, None] | None = None
        """the cards withdrawn or changed since ``changes()`` last returned (in order, each once), once
        ``track_changes()`` was called"""
        self._change_noted = asyncio.Event()

    def __repr__(self) -> str:
        return f"Provider(name={self.name!r}, namespace={self.keys.namespace!r}, epoch={self.epoch})"

    def redis_ms(self) -> int:
        """Now by the Redis clock, unix ms, as read at start and carried on by the loop's monotonic clock."""
        start_ms, start = self._clock
        return start_ms + int((asyncio.get_running_loop().time() - start) * 1000)

    @property
    def lost(self) -> bool:
        """True once the lease is gone: nothing more will be delivered or accepted."""
        return self._lost.is_set()

    async def wait_lost(self) -> None:
        await self._lost.wait()

    async def wait_handover(self) -> Handover:
        """Return once another provider asked for the lease (``handover``)."""
        await self._handover_asked.wait()
        assert self.handover is not None
        return self.handover

    def track_changes(self) -> None:
        """From now on, note every card withdrawn or changed, for ``changes()``.

        For a UI that shows every pending card at once (a web page): one waiter for them all, rather
        than a task per card waiting on its ``withdrawn`` and ``changed`` (with 100 000 pending those
        tasks were about 5 KB a card)."""
        if self._changes is None:
            self._changes = {}

    async def changes(self) -> list[PendingRequest]:
        """Wait for, and return, the cards withdrawn or changed since the last call (``track_changes()``
        first), each once, in the order they first changed. Their ``withdrawn`` and ``changed`` say what
        happened (``changed`` is left set: a UI that waits on it clears it)."""
        self.track_changes()
        assert self._changes is not None
        while not self._changes:
            self._change_noted.clear()
            await self._change_noted.wait()
        cards, self._changes = list(self._changes), {}
        return cards

    def _note_change(self, card: PendingRequest) -> None:
        if self._changes is not None:
            self._changes[card] = None
            self._change_noted.set()

    def fenced(self) -> None:
        if not self._lost.is_set():
            log.warning("provider %s lost the lease of %s (epoch %s)", self.name, self.keys.namespace, self.epoch)
            self._lost.set()
            self._wake.set()

    def forget(self, request_id: str) -> None:
        """An asker's request is settled or gone here; its card goes with the last of them."""
        card = self._shown.pop(request_id, None)
        if card is None:
            return
        card._shown_askers -= 1
        if card._shown_askers > 0:
            return
        self._lineup.remove(card)
        self._cards.pop(card.request_id, None)
        if self._coalescing.get(card._fingerprint) is card:
            del self._coalescing[card._fingerprint]

    @property
    def pending(self) -> list[PendingRequest]:
        """Requests delivered here and not yet settled or withdrawn, in presentation order.

        Urgent first, then normal, then low; within a level, round-robin across asking agents,
        each agent's oldest first (identical requests of several askers are one card). Orders
        every card: a view of the next few uses ``first(n)`` and ``pending_count``.
        """
        return [card for card in self._lineup.first(len(self._lineup)) if not card.is_withdrawn]

    def first(self, n: int) -> list[PendingRequest]:
        """The first ``n`` of ``pending``, in its order, in O(n log n + log N) for N pending."""
        return self._lineup.first(n)

    @property
    def pending_count(self) -> int:
        """How many requests ``pending`` lists, in O(1)."""
        return len(self._lineup)

    def __aiter__(self) -> AsyncIterator[PendingRequest]:
        return self

    async def __anext__(self) -> PendingRequest:
        """The next card to present, in the order ``pending`` describes."""
        while True:
            if self._lost.is_set():
                raise UserQuestionError("this provider no longer holds the lease", LEASE_LOST)
            if self.handover is not None:
                raise StopAsyncIteration
            card = self._schedule.pop(self._ready)
            if card is not None:
                card._handed_out = True
                return card
            self._wake.clear()
            await self._wake.wait()

    def take_ready(self, most: int) -> list[PendingRequest]:
        """Up to ``most`` more cards that are ready now, in ``__anext__``'s order, without waiting: after one
        ``anext``, a UI that shows many at once takes a failover's backlog in batches (the next ones ``anext``
        would return; none if the lease is lost or another provider asked for it)."""
        cards: list[PendingRequest] = []
        while len(cards) < most and not self._lost.is_set() and self.handover is None:
            card = self._schedule.pop(self._ready)
            if card is None:
                break
            card._handed_out = True
            cards.append(card)
        return cards

    def _ready(self, card: PendingRequest, level: int) -> bool:
        return (
            not card._handed_out
            and level == card.level
            and not card.is_withdrawn
            and self._cards.get(card.request_id) is card
        )

    def _reschedule(self, card: PendingRequest, was_level: int) -> None:
        """A card whose level changed (an urgent asker joined or left) moves in ``pending``; not yet
        handed out, it queues at its new level."""
        if card.level == was_level:
            return
        if self._cards.get(card.request_id) is card:
            self._lineup.move(card)
        if not card._handed_out:
            self._schedule.push(card, card.level, card.agent_id)
            self._wake.set()

    def _place(self, pending: PendingRequest, coalesce: bool) -> PendingRequest | None:
        """A delivered request joins the card of an identical one of another asker, or is a new card (returned).

        An asker is an agent id in one asking process (or an agentless process).
        """
        fingerprint = request_fingerprint(pending.request) if coalesce else ""
        card = self._coalescing.get(fingerprint) if fingerprint else None
        member = pending._members[0]
        if card is not None and (card._settling or self._cards.get(card.request_id) is not card):
            card = None  # its answer is on the way (it would miss this asker), or it is gone
        if card is not None and card._members.has_asker(member):
            card = None  # one asker asking the same thing twice means it twice
        if card is not None:
            level = card.level
            card._join(member)
            self._shown[pending.request_id] = card
            card._shown_askers += 1
            self._reschedule(card, level)
            return None
        self._cards[pending.request_id] = pending
        self._shown[pending.request_id] = pending
        pending._shown_askers = 1
        self._lineup.add(pending)
        if fingerprint:
            self._coalescing[fingerprint] = pending
            pending._fingerprint = fingerprint
        return pending

    async def settle_all(self, settlements: list[_Settlement]) -> list[Reply | Refusal]:
        """Settlements (a coalesced card's askers) through settle.lua, a reply for each.

        Those queued meanwhile go in the same call, sealed together under one signature.
        """
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Reply | Refusal]] = []
        for settlement, seal in settlements:
            futures.append(loop.create_future())
            self._settles.append((settlement, seal, futures[-1]))
        if self._settler is None or self._settler.done():
            self._settler = asyncio.ensure_future(self._send_settles())
        if len(futures) == 1:  # the usual case; gather's machinery was 5 % of a busy provider's CPU
            return [await futures[0]]
        return list(await asyncio.gather(*futures))

    async def _send_settles(self) -> None:
        settings = self.settings
        carrier: tuple[list[str], list[Any]] | None = None  # the last decisions sent: their keys, D and arguments
        while self._settles:
            batch, self._settles = self._settles[:_SETTLE_BATCH], self._settles[_SETTLE_BATCH:]
            first, *_ = batch[0]
            if first.decisions[0] == _CARRIED and carrier is not None:
                # A coalesced card split across calls: this call carries its decisions again (written once).
                carried = msgspec.structs.replace(first, decision_keys=carrier[0], decisions=carrier[1])
                batch[0] = (carried, batch[0][1], batch[0][2])
            for settlement, _, _ in batch:
                if settlement.decisions[0] > 0:
                    carrier = (settlement.decision_keys, settlement.decisions)
            # Sealed once per batch, before the first send: a retry after a lost reply sends the same bytes.
            sealed = seal_outcomes(
                self._signing_key, self.keys.namespace, self.epoch, self.redis_ms(), [s for _, s, _ in batch]
            )
            for (settlement, _, _), outcome in zip(batch, sealed, strict=True):
                settlement.outcome = outcome
            try:
                reply = await scripts.settle(
                    self.commands,
                    lease=self.keys.provider,
                    requests=self.keys.requests,
                    audit=self.keys.audit,
                    decisions=self.keys.decisions,
                    decision_expiry=self.keys.decision_expiry,
                    fence=self.fence,
                    provider=self.name,
                    epoch=self.epoch,
                    group=GROUP,
                    audit_max=settings.audit_maxlen,
                    result_ttl=int(settings.result_ttl * 1000),
                    hold_notices="1" if settings.min_replicas else "0",
                    settlements=[settlement for settlement, _, _ in batch],
                )
            except BaseException as error:
                for _, _, future in batch:
                    if future.done():
                        continue
                    if isinstance(error, asyncio.CancelledError):
                        future.cancel()
                    else:
                        future.set_exception(error)
                if not isinstance(error, Exception):
                    raise
                continue
            replies = [reply] * len(batch) if isinstance(reply, Refusal) else reply
            for (_, _, future), one in zip(batch, replies, strict=True):
                if not future.done():
                    future.set_result(one)

    # -- background work, run by Broker.provider() in its task group ------------------

    async def keep_lease(self) -> None:
        """Renew the lease every third of its TTL; fence ourselves once Redis says it is gone.

        Not before: while Redis cannot be reached nobody can take the lease, and a lease that lapsed while Redis
        restarted is still ours (scripts/_kept.lua). After a failure the renewal is sent first, before anything
        queued meanwhile (``Commands.lead_after_outage``): a fenced script must not find the lease missing
        before the renewal takes it back. A provider cut off from a Redis that others reach learns that it lost
        the lease when it reaches Redis again; until then Redis refuses whatever it sends there.
        """
        ttl, keys = self.settings.lease_ttl, self.keys
        lease = {"lease": keys.provider, "standbys": keys.standbys, "record": keys.lease_record, "fence": self.fence}
        ttl_ms, member = int(ttl * 1000), f"{self.token}:{self.name}"
        stop_leading = scripts.lease_renew_first(
            self.commands, **lease, ttl=ttl_ms, member=member, renewed=self._renewed
        )
        try:
            while not self._lost.is_set():
                await asyncio.sleep(ttl / 3)
                try:
                    renewed = await scripts.lease_renew(self.commands, **lease, ttl=ttl_ms, member=member)
                except Exception as error:
                    log.warning("lease renewal failed: %r", error)
                    continue
                self._renewed(renewed)
                if renewed:
                    await self._check_handover()
        finally:
            stop_leading()

    def _renewed(self, renewed: bool) -> None:
        if not renewed:
            self.fenced()

    async def _check_handover(self) -> None:
        """Whether another provider asked for the lease; a failure to read it is only a later notice."""
        if self.handover is not None:
            return
        try:
            reserved = await self.commands.call("GET", self.keys.handover)
        except Exception as error:
            log.debug("could not read the handover reservation: %r", error)
            return
        to, _, rest = str(reserved or "").partition("\n")
        by, _, grace_ms = rest.partition("\n")
        if reserved and to != self.name:
            log.info("provider %s: %s asks that %s take the lease of %s", self.name, by, to, self.keys.namespace)
            grace = int(grace_ms) / 1000 if grace_ms.isdigit() else HANDOVER_GRACE
            self.handover = Handover(to, by, grace)
            self._handover_asked.set()
            self._wake.set()

    async def seal_audit(self) -> None:
        """Checkpoint the audit at once, then every ``checkpoint_every`` seconds while it moves.

        Each checkpoint signs the chain head (docs/security.md, "a tamper-evident audit"): one
        signature per period however busy the namespace, none while it is idle. Until the next
        one, the entries after the last checkpoint are chained but not signed.
        """
        while not self._lost.is_set():
            await self.checkpoint()
            await asyncio.sleep(self.checkpoint_every)

    async def checkpoint(self) -> None:
        """One audit checkpoint, unless nothing moved since this provider's last; a failure is only logged."""
        try:
            self._checkpoint = (
                await audit.checkpoint(
                    self.commands,
                    self.keys,
                    self._signing_key,
                    provider=self.name,
                    epoch=self.epoch,
                    maxlen=self.settings.audit_maxlen,
                    unless_at=self._checkpoint,
                    after=self._checkpoint,
                )
                or self._checkpoint
            )
        except Exception as error:
            log.warning("audit checkpoint failed: %r (the next one seals what this one would have)", error)

    @property
    def last_checkpoint(self) -> str | None:
        """The entry id of the audit checkpoint this process wrote last, for the next provider of its broker."""
        return self._checkpoint

    async def read(self) -> None:
        """Deliver the stream's requests into the local queue until the lease is lost."""
        backoff = Backoff(first=0.05, cap=2.0)
        claim_backlog = True
        block_s = self.settings.block_s
        while not self._lost.is_set():
            try:
                if claim_backlog:
                    await self._claim_backlog()
                    claim_backlog = False
                async with asyncio.timeout(block_s + _REPLY_MARGIN_S):
                    reply = await self._blocking.xreadgroup(
                        GROUP, self.consumer, {self.keys.requests: ">"}, count=_READ_COUNT, block=int(block_s * 1000)
                    )
                for _stream, entries in reply or ():
                    await self._take(entries)
                backoff.reset()
            except Exception as error:
                if isinstance(error, ResponseError) and "NOGROUP" in str(error):
                    claim_backlog = True  # creates the group
                    continue
                # Entries read just before the break sit in our pending list: claim them again.
                claim_backlog = True
                delay = backoff.next()
                if is_transient(error):
                    log.warning("provider read interrupted (%r); retrying in %.2fs", error, delay)
                else:
                    log.error("provider read failed (%r); retrying in %.2fs", error, delay)
                await asyncio.sleep(delay)

    async def reclaim(self) -> None:
        """Every ``reclaim_every`` seconds, claim entries idle in any pending list and present them."""
        settings = self.settings
        min_idle_ms = int(settings.reclaim_every * 1000)
        while not self._lost.is_set():
            await asyncio.sleep(settings.reclaim_every)
            if self._claiming_backlog:
                continue  # it claims every pending entry, idle or not; the next round looks again
            try:
                await self._reclaim_idle(min_idle_ms)
            except Exception as error:
                log.warning("reclaiming idle entries failed: %r", error)

    async def _reclaim_idle(self, min_idle_ms: int) -> None:
        shown = {member.entry_id for card in self._cards.values() for member in card._members}
        start = "-"
        while True:
            idle = await self.commands.call(
                "XPENDING", self.keys.requests, GROUP, "IDLE", min_idle_ms, start, "+", _READ_COUNT, parse_detail=True
            )
            ids = [entry["message_id"] for entry in idle if entry["message_id"] not in shown]
            if ids:
                claimed = await self.commands.call(
                    "XCLAIM", self.keys.requests, GROUP, self.consumer, min_idle_ms, *ids
                )
                await self._take([(entry_id, _pairs(fields)) for entry_id, fields in claimed if fields is not None])
            if len(idle) < _READ_COUNT:
                return
            start = "(" + idle[-1]["message_id"]

    async def _claim_backlog(self) -> None:
        """Take over every entry a previous holder (or we, before a reconnect) left unsettled."""
        await ensure_group(self.commands, self.keys)

        def claim(cursor: str) -> asyncio.Future[Any]:
            return self.commands.send(
                "XAUTOCLAIM", self.keys.requests, GROUP, self.consumer, 0, cursor, "COUNT", _READ_COUNT
            )

        # The next read is claimed while this one is delivered (one round trip for both, not two in turn): a
        # backlog of 100 000 is 391 reads. What is claimed and not yet delivered when this stops (fenced, Redis
        # gone) sits in this consumer's pending list, claimed again after a reconnect or by the next holder.
        claiming = claim("0-0")
        self._claiming_backlog = True
        try:
            while True:
                reply = await claiming
                cursor, entries = reply[0], reply[1]
                if cursor != "0-0":
                    claiming = claim(cursor)
                await self._take([(e[0], _pairs(e[1])) for e in entries if e and e[1] is not None])
                if cursor == "0-0" or self._lost.is_set():
                    break
        finally:
            self._claiming_backlog = False
            if not claiming.done():
                claiming.cancel()
            elif not claiming.cancelled():
                claiming.exception()  # retrieved: a prefetch that failed after this stopped is only let go
        await self._drop_idle_consumers()

    async def _drop_idle_consumers(self) -> None:
        for consumer in await self.commands.call("XINFO", "CONSUMERS", self.keys.requests, GROUP):
            info = _pairs(consumer)
            if info.get("name") != self.consumer and int(info.get("pending", 0)) == 0:
                await self.commands.call("XGROUP", "DELCONSUMER", self.keys.requests, GROUP, info["name"])

    async def _take(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Present the entries of one read: all its asks through one deliver call, then its notices."""
        asks: list[tuple[str, dict[str, str], str, str]] = []
        notices: list[tuple[str, str, str, str]] = []
        new_cards: list[PendingRequest] = []
        for entry_id, fields in entries:
            kind, request_id, client_id = fields.get("kind"), fields.get("rid", ""), fields.get("client", "")
            if kind in _NOTICES and request_id:
                notices.append((entry_id, kind, request_id, client_id))
            elif kind != "ask" or not _ID.match(request_id) or not _ID.match(client_id):
                await self._dead_letter(entry_id, fields, "malformed stream entry")
            elif request_id not in self._shown and request_id not in self._delivering:
                asks.append((entry_id, fields, request_id, client_id))
                self._delivering.add(request_id)
        shown: list[tuple[PendingRequest, bool]] = []
        try:
            if asks:
                shown = await self._deliver(asks)
        finally:
            self._delivering.difference_update(request_id for _, _, request_id, _ in asks)
        for pending, coalesce in shown:
            if (card := self._place(pending, coalesce)) is not None:
                # Scheduled as it is listed: a failure below must not leave it in pending, never handed out.
                self._schedule.push(card, card.level, card.agent_id)
                new_cards.append(card)
        try:
            for entry_id, kind, request_id, client_id in notices:
                if not await self._take_notice(entry_id, kind, request_id, client_id):
                    break
        finally:
            if new_cards:  # woken once this read's withdraw notices have taken their cards down
                self._wake.set()

    async def _take_notice(self, entry_id: str, kind: str, request_id: str, client_id: str) -> bool:
        """A notice: take the card down (withdraw), or mark its asker away or back; False when fenced.

        A ``back`` notice may name the request's new asking process: settlements go to it.
        """
        acked = await scripts.notice_ack(
            self.commands,
            lease=self.keys.provider,
            requests=self.keys.requests,
            fence=self.fence,
            entry=entry_id,
            group=GROUP,
        )
        if not acked:
            self.fenced()
            return False
        card = self._shown.get(request_id)
        if card is None:
            return True
        if kind == "withdraw":
            level = card.level
            self.forget(request_id)
            if card._leave(request_id):
                card._set_withdrawn()
            else:
                self._reschedule(card, level)
        elif (member := card._member(request_id)) is not None:
            # The notice says something changed; what is true now is the request hash's.
            client, away, remember = await self.commands.call(
                "HMGET", self.keys.request(request_id), "client", "away", "remember"
            )
            was = (card.asker_away, card.opted_out)
            if client and _ID.match(client) and client != member.client_id:
                card._members.rebind(member, client)
                if member.verified and not self._attested(member):
                    member.verified = False  # attested for the process it was asked from, not this one
                    card._set_changed()
            gone = client is None and away is None  # the hash expired meanwhile: the notice's word is all there is
            card._members.set_away(member, kind == "away" if gone else away is not None or client == "")
            if remember is not None:
                card._members.set_opted_out(member, remember == "0")
            if (card.asker_away, card.opted_out) != was:
                card._set_changed()
        return True

    async def _deliver(self, asks: list[tuple[str, dict[str, str], str, str]]) -> list[tuple[PendingRequest, bool]]:
        """deliver.lua for one read's asks; each presentable one with whether it may be coalesced.

        Who asks is the request hash's: an ask whose hash names another client than its entry (a keyed ask
        re-attached) is delivered again with that client's keys.
        """
        shown: list[tuple[PendingRequest, bool]] = []
        for _ in range(3):
            moved = await self._deliver_once(asks, shown)
            if not moved:
                break
            asks = moved
        return shown

    async def _deliver_once(
        self, asks: list[tuple[str, dict[str, str], str, str]], shown: list[tuple[PendingRequest, bool]]
    ) -> list[tuple[str, dict[str, str], str, str]]:
        keys = self.keys
        entries = []
        for entry_id, fields, request_id, client_id in asks:
            agent_id = fields.get("agent", "")
            request_key = keys.request(request_id)
            entries.append(
                Delivering(
                    request=request_key,
                    record=keys.agent(agent_id) if agent_id else request_key,
                    liveness=keys.client(client_id),
                    inbox=keys.inbox(client_id),
                    outcome=keys.outcome(request_id),
                    entry=entry_id,
                    rid=request_id,
                    want_body="0" if "request" in fields else "1",
                )
            )
        deliveries = await scripts.deliver(
            self.commands,
            lease=keys.provider,
            requests=keys.requests,
            audit=keys.audit,
            away=keys.away,
            fence=self.fence,
            group=GROUP,
            epoch=self.epoch,
            result_ttl=int(self.settings.result_ttl * 1000),
            audit_max=self.settings.audit_maxlen,
            liveness_grace=int(self.settings.liveness_grace * 1000),
            entries=entries,
        )
        if isinstance(deliveries, Refusal):
            self.fenced()
            return []
        moved: list[tuple[str, dict[str, str], str, str]] = []
        for (entry_id, fields, request_id, client_id), one in zip(asks, deliveries, strict=True):
            if one.kind == "moved":
                moved.append((entry_id, fields, request_id, str(one.client)))
                continue
            if one.kind == "gone":
                log.info("request %s not presented: %s", request_id, one.body)
                continue
            raw: str = fields.get("request") or one.body  # type: ignore[assignment]
            try:
                request = decode_request(raw)
                check_request(request, self.settings.limits)
            except (msgspec.DecodeError, UserQuestionError) as error:
                await self._dead_letter(entry_id, fields, f"undeliverable request: {error}")
                continue
            # the hash's word (who asks, the opt-outs), the entry's only for a hash written before it had them
            remember = one.remember or fields.get("remember", "1")
            coalesce = one.coalesce or fields.get("coalesce", "1")
            pending = PendingRequest(
                self,
                request_id=request_id,
                request=request,
                request_sha=hashlib.sha256(raw.encode()).hexdigest(),
                client_id=one.client if one.client is not None else client_id,
                created_ms=one.created_ms,
                entry_id=entry_id,
                asker_away=one.away,
                durable=one.key,
                opted_out=remember == "0",
                attestation=fields.get("attest", ""),
                deadline_ms=one.deadline_ms,
            )
            member = pending._members[0]
            member.verified = self._attested(member)
            shown.append((pending, self.coalesce and coalesce != "0"))
        return moved

    def _attested(self, member: _Member) -> bool:
        """Whether a pinned gateway attested this very ask: request, agent and asking process."""
        gateways = self.settings.gateway_keys
        if not gateways or not member.attestation:
            return False
        return gateways.verify_attestation(
            member.attestation,
            namespace=self.keys.namespace,
            request_id=member.request_id,
            request_sha=member.request_sha,
            agent=member.request.agent or "",
            client=member.client_id,
        )

    async def _dead_letter(self, entry_id: str, fields: dict[str, str], reason: str) -> None:
        keys = self.keys
        request_id, client_id = fields.get("rid", ""), fields.get("client", "")
        known = bool(_ID.match(request_id) and _ID.match(client_id))
        log.warning("dead-lettering stream entry %s: %s", entry_id, reason)
        await scripts.deadletter(
            self.commands,
            requests=keys.requests,
            dead=keys.dead,
            request=keys.request(request_id) if known else keys.dead,
            outcome=keys.outcome(request_id) if known else keys.dead,
            inbox=keys.inbox(client_id) if known else keys.dead,
            audit=keys.audit,
            entry=entry_id,
            reason=reason,
            group=GROUP,
            dead_max=self.settings.dead_maxlen,
            result_ttl=int(self.settings.result_ttl * 1000),
            rid=request_id if known else "",
            audit_max=self.settings.audit_maxlen,
            fields=encode(fields),
        )


async def ensure_group(commands: Commands, keys: Keys) -> None:
    """Create the providers' consumer group, reading from the stream's start."""
    try:
        await commands.call("XGROUP", "CREATE", keys.requests, GROUP, "0", "MKSTREAM")
    except ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise


async def acquire_lease(
    *,
    commands: Commands,
    blocking: Redis | RedisCluster,
    keys: Keys,
    name: str,
    settings: ProviderSettings,
    standby: bool,
    on_standby: Callable[[str], Any] | None = None,
) -> tuple[str, int]:
    """Take the lease, waiting as a registered standby when ``standby``; returns (token, epoch).

    With ``settings.min_replicas``, the lease counts as taken only once that many replicas
    have it (WAIT): a failover right after cannot hand the namespace to a second holder.
    """
    token = secrets.token_hex(16)
    ttl_ms = int(settings.lease_ttl * 1000)
    announced = False
    member = f"{token}:{name}"
    backoff = Backoff(first=0.05, cap=2.0)
    try:
        while True:
            lease = await scripts.lease_acquire(
                commands,
                lease=keys.provider,
                epoch=keys.epoch,
                standbys=keys.standbys,
                handover=keys.handover,
                record=keys.lease_record,
                token=token,
                name=name,
                ttl=ttl_ms,
                standby_ttl=ttl_ms * 3 if standby else 0,
            )
            epoch, remaining_ms = lease.epoch, lease.remaining_ms
            if epoch:
                if await replicated(commands, settings, f"the lease of {keys.namespace}"):
                    return token, epoch
                await asyncio.sleep(backoff.next())
                continue
            holder = _holder_name(lease.holder)
            if not standby:
                raise UserQuestionError(
                    f"provider {holder!r} is already active in namespace {keys.namespace!r}", DUPLICATE_PROVIDER
                )
            if not announced:
                log.info("standing by: %s holds the lease of %s", holder, keys.namespace)
                if on_standby is not None:
                    on_standby(holder)
                announced = True
            # Wake at once on a clean release, else when the holder's lease would lapse,
            # and at least every lease TTL to refresh our standby registration.
            wait_s = max(0.01, min(remaining_ms, ttl_ms) / 1000 + 0.005)
            try:
                async with asyncio.timeout(wait_s + _REPLY_MARGIN_S):
                    await blocking.execute_command("BLPOP", keys.lease_signal, wait_s)
                backoff.reset()
            except Exception as error:
                delay = backoff.next()
                log.warning("standby wait interrupted (%r); trying again in %.2fs", error, delay)
                await asyncio.sleep(delay)
    except BaseException:
        try:
            await commands.call("ZREM", keys.standbys, member)
        except Exception as error:
            log.info("could not leave the standbys: %r (the registration expires)", error)
        raise


async def replicated(commands: Commands, settings: ProviderSettings, what: str) -> bool:
    """True once ``settings.min_replicas`` replicas have every write sent so far (at once when 0)."""
    if settings.min_replicas <= 0:
        return True
    acked = int(await commands.call("WAIT", settings.min_replicas, int(settings.replica_timeout * 1000)))
    if acked < settings.min_replicas:
        log.warning(
            "%s reached %d of %d replicas in %.1fs", what, acked, settings.min_replicas, settings.replica_timeout
        )
        return False
    return True


async def release_lease(commands: Commands, keys: Keys, provider: Provider) -> None:
    await scripts.lease_release(
        commands,
        lease=keys.provider,
        signal=keys.lease_signal,
        standbys=keys.standbys,
        record=keys.lease_record,
        fence=provider.fence,
        member=f"{provider.token}:{provider.name}",
    )


def _holder_name(value: str) -> str:
    parts = value.split(":", 2)
    return parts[2] if len(parts) == 3 else value


def _pairs(flat: Any) -> dict[str, Any]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
