"""A provider's cards: each pending request delivered to it, and the order they are presented in.

Identical requests of several askers are one card (``PendingRequest``), unless the provider
was asked not to coalesce. ``Cards`` keeps the live cards by request id, the order ``pending``
lists them in, the order they are handed out in, and which cards changed since a UI last looked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from redis.exceptions import RedisError

from .._redis_errors import unavailable
from .._scripts import Refusal, Reply
from ..decisions import Remember, check_remember, why_not_rememberable
from ..errors import ASK_CANCELLED, LEASE_LOST, NOT_PENDING, UserQuestionError
from ..types import PRIORITIES, AskUserQuestionAnswer, AskUserQuestionRequest, Outcome, encode
from ..validation import check_answer
from ._members import Members
from ._schedule import Lineup, Schedule, request_fingerprint
from .lease import Lease
from .settling import Route, SealedSettlement, Settler, Verdict

__all__ = ["Asker", "Cards", "Member", "PendingRequest"]


class Asker(NamedTuple):
    """One asker of a (possibly coalesced) pending request."""

    agent_id: str | None
    request_id: str
    verified: bool = False
    """its agent id was attested by a pinned gateway for this very request; else only claimed"""


@dataclass(eq=False, kw_only=True, slots=True)
class Member:
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
        "_board",
        "_changed",
        "_fingerprint",
        "_handed_out",
        "_members",
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
        board: Cards,
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
        verified: bool = False,
        deadline_ms: int | None = None,
    ) -> None:
        self._board = board
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
            Member(
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
                verified=verified,
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
    def settler(self) -> Settler:
        """What settles this card under its provider's lease (and records a quorum's votes on it)."""
        return self._board.settler

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
        self, answer: AskUserQuestionAnswer, *, by: str = "", remember: Remember | None = None, route: Route = None
    ) -> AskUserQuestionAnswer:
        """Settle with ``answer``; ``BAD_ANSWER`` leaves the request pending. Returns it as sent.

        ``remember`` also stores the answer as a decision for later identical questions (this agent's or the
        whole namespace's), atomically with the settlement; an answer that cannot be remembered (free text, a
        skip, an asker that opted out) is refused with ``BAD_ANSWER``. Every asker of a coalesced card gets the
        answer under its own question ids. ``route``: for the audit (``Settler.settlements``).
        """
        accepted = check_answer(self.request, answer, self.settler.settings.limits)
        if remember is not None:
            check_remember(self.request, accepted, remember, opted_out=self.opted_out)
        await self._settle(Verdict("answered", by, accepted, remember, route=route))
        return accepted

    async def cancel(
        self, message: str = "the human dismissed the question", *, by: str = "", route: Route = None
    ) -> None:
        """Settle as dismissed: every asker gets ``ASK_CANCELLED``; ``route`` as for ``answer``."""
        error = UserQuestionError(message, ASK_CANCELLED)
        await self._settle(
            Verdict("cancelled", by, error=encode(Outcome(error=error.to_payload())).decode(), route=route)
        )

    def _join(self, member: Member) -> None:
        self._members.add(member)
        self._board._count_entry(self, member.entry_id, 1)
        self._set_changed()

    def _leave(self, request_id: str) -> bool:
        """Drop one asker; True when it was the last (kept: settling the card is then NOT_PENDING)."""
        if self._members.get(request_id) is None:
            return False
        if len(self._members) == 1:
            return True
        member = self._members.remove(request_id)
        if member is not None:
            self._board._count_entry(self, member.entry_id, -1)
        self._set_changed()
        return False

    def _set_changed(self) -> None:
        self.changed.set()
        self._board._note_change(self)

    def _set_withdrawn(self) -> None:
        self.withdrawn.set()
        self._board._note_change(self)

    async def _settle(self, verdict: Verdict) -> None:
        members = list(self._members)
        settler = self.settler
        self._settling = True  # an identical request arriving now gets a card of its own
        try:
            settlements = await settler.settlements(self.request, members, verdict)
            try:
                replies = await settler.settle_all(settlements)
            except (RedisError, OSError) as failure:
                raise unavailable(failure, "settling the request") from failure
        finally:
            self._settling = False
        await self._settled(members, settlements, replies)

    async def _settled(
        self, members: list[Member], settlements: list[SealedSettlement], replies: list[Reply | Refusal]
    ) -> None:
        """Forget the settled askers (and those already gone); raise when none was settled here."""
        board = self._board
        refused: UserQuestionError | None = None
        settled = False
        tell: list[tuple[str, str, str]] = []
        """settled askers still to be told: (request id, outcome, the client the request hash names)"""
        for member, (settlement, _), reply in zip(members, settlements, replies, strict=True):
            if isinstance(reply, Reply):  # 'ok'
                settled = True
                if reply.value:
                    tell.append((member.request_id, settlement.outcome, reply.value))
                board.forget(member.request_id)
                continue
            if reply.code == LEASE_LOST:
                board.lease.fenced()
                raise reply.error()
            if reply.code == NOT_PENDING:  # withdrawn, lapsed or settled meanwhile: it leaves the card
                shown = board.card_of(member.request_id) is self
                board.forget(member.request_id)
                if shown and self._leave(member.request_id):
                    self._set_withdrawn()  # its last asker: the UI takes the card down
            refused = refused or reply.error()
        if refused is not None and (not settled or refused.code != NOT_PENDING):
            raise refused
        # Only the askers the hash names as waiting (never an away or detached one: settle.lua knows).
        if settled:
            await self.settler.tell(self.request_id, tell)


class Cards:
    """The live cards of one provider: by asker, in ``pending``'s order, and in the order they are handed out."""

    def __init__(self, lease: Lease, settler: Settler, *, coalesce: bool) -> None:
        self.lease = lease
        self.settler = settler
        self.coalesce = coalesce
        """False: every request is its own card (``Broker.provider(..., coalesce=False)``)"""
        self.wake = asyncio.Event()
        """set when a card may be ready to hand out (or the lease is lost, or a handover asked)"""
        self._schedule: Schedule[PendingRequest] = Schedule()
        """the cards not yet handed out, in the order ``hand_out`` hands them out"""
        self._lineup: Lineup[PendingRequest] = Lineup()
        """the live cards in ``pending``'s order"""
        self._cards: dict[str, PendingRequest] = {}
        """the live cards, by card id (their first asker's request id)"""
        self._shown: dict[str, PendingRequest] = {}
        """every asker's request id -> its card"""
        self._coalescing: dict[str, PendingRequest] = {}
        """request fingerprint -> the card identical requests join"""
        self._entries: dict[str, int] = {}
        """the stream entry ids of the live cards' members (how many members each): kept as they come and go, so
        that a reclaim round need not walk every card (13 % of a core at 10 000 pending)"""
        self._changes: dict[PendingRequest, None] | None = None
        """the cards withdrawn or changed since ``changes()`` last returned (in order, each once), once
        ``track_changes()`` was called"""
        self._change_noted = asyncio.Event()

    def card_of(self, request_id: str) -> PendingRequest | None:
        """The card an asker's request is shown on, if it is."""
        return self._shown.get(request_id)

    @property
    def asker_count(self) -> int:
        """How many askers' requests the cards stand for."""
        return len(self._shown)

    def holds_entry(self, entry_id: str) -> bool:
        """Whether a live card's asker was delivered from this stream entry."""
        return entry_id in self._entries

    def _count_entry(self, card: PendingRequest, entry_id: str, by: int) -> None:
        """A live card's member came (1) or went (-1)."""
        if self._cards.get(card.request_id) is not card:
            return
        count = self._entries.get(entry_id, 0) + by
        if count > 0:
            self._entries[entry_id] = count
        else:
            self._entries.pop(entry_id, None)

    @property
    def pending(self) -> list[PendingRequest]:
        return [card for card in self._lineup.first(len(self._lineup)) if not card.is_withdrawn]

    def first(self, n: int) -> list[PendingRequest]:
        return self._lineup.first(n)

    @property
    def pending_count(self) -> int:
        return len(self._lineup)

    def hand_out(self) -> PendingRequest | None:
        """The next card ready to present, marked handed out; None when none is."""
        card = self._schedule.pop(self._ready)
        if card is not None:
            card._handed_out = True
        return card

    def _ready(self, card: PendingRequest, level: int) -> bool:
        return (
            not card._handed_out
            and level == card.level
            and not card.is_withdrawn
            and self._cards.get(card.request_id) is card
        )

    def _reschedule(self, card: PendingRequest, was_level: int) -> None:
        """A card whose level changed (an urgent asker came or went) moves in ``pending``, requeued if not out."""
        if card.level == was_level:
            return
        if self._cards.get(card.request_id) is card:
            self._lineup.move(card)
        if not card._handed_out:
            self._schedule.push(card, card.level, card.agent_id)
            self.wake.set()

    def place(self, pending: PendingRequest, coalesce: bool) -> PendingRequest | None:
        """A delivered request joins the card of an identical one of another asker, or is a new card (returned,
        scheduled as it is listed: a failure after must not leave it in pending, never handed out).

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
        self._count_entry(pending, member.entry_id, 1)
        pending._shown_askers = 1
        self._lineup.add(pending)
        if fingerprint:
            self._coalescing[fingerprint] = pending
            pending._fingerprint = fingerprint
        self._schedule.push(pending, pending.level, pending.agent_id)
        return pending

    def forget(self, request_id: str) -> None:
        """An asker's request is settled or gone here; its card goes with the last of them."""
        card = self._shown.pop(request_id, None)
        if card is None:
            return
        card._shown_askers -= 1
        if card._shown_askers > 0:
            return
        self._lineup.remove(card)
        gone = self._cards.get(card.request_id)
        if gone is not None:
            for member in gone._members:
                self._count_entry(gone, member.entry_id, -1)
            del self._cards[card.request_id]
        if self._coalescing.get(card._fingerprint) is card:
            del self._coalescing[card._fingerprint]

    def withdraw(self, request_id: str) -> None:
        """An asker withdrew its request: it leaves its card, which the UI takes down with its last asker."""
        card = self._shown.get(request_id)
        if card is None:
            return
        level = card.level
        self.forget(request_id)
        if card._leave(request_id):
            card._set_withdrawn()
        else:
            self._reschedule(card, level)

    def update_asker(
        self,
        request_id: str,
        *,
        away_notice: bool,
        client: str | None,
        rebind_to: str | None,
        away: str | None,
        remember: str | None,
        attested: Callable[[Member], bool],
    ) -> None:
        """What the request hash says now of an asker (``away`` or ``back`` notice): its process, away, opt-out.

        A ``back`` notice may name the request's new asking process (``rebind_to``): settlements go to it.
        """
        card = self._shown.get(request_id)
        member = None if card is None else card._members.get(request_id)
        if card is None or member is None:
            return
        was = (card.asker_away, card.opted_out)
        if rebind_to is not None and rebind_to != member.client_id:
            card._members.rebind(member, rebind_to)
            if member.verified and not attested(member):
                member.verified = False  # attested for the process it was asked from, not this one
                card._set_changed()
        gone = client is None and away is None  # the hash expired meanwhile: the notice's word is all there is
        card._members.set_away(member, away_notice if gone else away is not None or client == "")
        if remember is not None:
            card._members.set_opted_out(member, remember == "0")
        if (card.asker_away, card.opted_out) != was:
            card._set_changed()

    def track_changes(self) -> None:
        if self._changes is None:
            self._changes = {}

    async def changes(self) -> list[PendingRequest]:
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
