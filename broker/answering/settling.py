"""Settling a provider's cards: the fenced settle.lua calls, batched, sealed and sent in order.

An answer or dismissal of a card becomes one settlement per asker (each under its own question
ids, sealed to its own request). Settlements queued while a call is on its way go in the next
call together, sealed under one signature; the batches are sent by one task the provider owns
(``run``). A quorum's votes (broker/answering/quorum.py) are settle-shaped acts under the same fence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from .. import audit
from .._ids import UniqueIds
from .._scripts import Refusal, Reply, Settlement, approve, settle
from ..decisions import Remember, settle_extension
from ..errors import BROKER_UNAVAILABLE, LEASE_LOST, UserQuestionError
from ..signing import Seal, SigningKey, seal_outcomes
from ..types import AskUserQuestionAnswer, AskUserQuestionRequest, Outcome, encode
from .lease import Lease, replicated

__all__ = ["Asked", "Route", "SealedSettlement", "Settler", "Verdict"]

log = logging.getLogger(__name__)

_SETTLE_BATCH = 256
"""settlements sent in one settle.lua call at most"""
_CARRIED = -1
"""settle.lua's D for a coalesced card's later asker: the card's decisions go with it when the first asker's
request was no longer pending"""

Route = Sequence[str] | None
"""the groups a card was routed to when settled (empty: to nobody); ``None``: its provider does not route"""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """How a card is settled, the same for each of its askers (``Settler.settlements``)."""

    state: str
    """'answered' or 'cancelled'"""
    by: str
    answer: AskUserQuestionAnswer | None = None
    remember: Remember | None = None
    """a decision to remember with the answer (``answer`` only)"""
    error: str = ""
    """the outcome JSON of a cancellation"""
    route: Route = None
    """the groups the card was routed to (empty: to nobody), recorded in each audit entry so that a history shows
    the card to whom it showed it; ``None``: this provider does not route (none recorded)"""


SealedSettlement = tuple[Settlement, Seal]
"""one settlement's part of a settle.lua call, and what seals its outcome"""
_Queued = tuple[Settlement, Seal, "asyncio.Future[Reply | Refusal]"]


class Asked(Protocol):
    """One asker of a card, as settling sees it."""

    request_id: str
    request: AskUserQuestionRequest
    request_sha: str
    durable: str
    client_id: str
    verified: bool


class Settler:
    """Sends a provider's settlements (and a quorum's votes) under its lease's fence."""

    def __init__(self, lease: Lease, *, signing_key: SigningKey, redis_ms: int) -> None:
        self.lease = lease
        self.commands = lease.commands
        self.keys = lease.keys
        self.settings = lease.settings
        self.signing_key = signing_key
        self._clock = (redis_ms, asyncio.get_running_loop().time())
        """the Redis clock (unix ms) read when the provider started, and the loop's time then"""
        self.call_ids = UniqueIds()
        """one per settle.lua settlement, so that a retry after a lost reply recognises its own"""
        self._queue: list[_Queued] = []
        self._queued = asyncio.Event()
        self._running = False
        """``run`` sends the queue; else (before it starts, once it stopped) each caller sends it"""
        self._sending = asyncio.Lock()
        """one sender at a time, so that batches go in order and a card split across calls carries its decisions"""
        self._carrier: tuple[list[str], list[Any]] | None = None
        """the last decisions sent (their keys, D and arguments): the next call carries them for a split card"""

    def redis_ms(self) -> int:
        """Now by the Redis clock, unix ms, as read at start and carried on by the loop's monotonic clock."""
        start_ms, start = self._clock
        return start_ms + int((asyncio.get_running_loop().time() - start) * 1000)

    async def settlements(
        self, shown: AskUserQuestionRequest, members: Sequence[Asked], verdict: Verdict
    ) -> list[SealedSettlement]:
        """A settlement for each of a card's askers (``members``, the first asker first; ``shown`` its request)."""
        state, by, answer, remember = verdict.state, verdict.by, verdict.answer, verdict.remember
        routed = "" if verdict.route is None else msgspec.json.encode(list(verdict.route)).decode()
        now_ms = 0
        if remember is not None:  # a decision's signed expiry is counted by the Redis clock
            seconds, micros = await self.commands.call("TIME")
            now_ms = int(seconds) * 1000 + int(micros) // 1000
        settlements = []
        by_ids: dict[tuple[str, ...], tuple[AskUserQuestionAnswer, str]] = {}
        """the answer and its outcome JSON under each set of question ids: a card's askers mostly share one"""
        for member in members:
            outcome = verdict.error
            extra_keys: list[str] = []
            extra_args: list[Any] = [0]
            if answer is not None:
                ids = tuple(question.id for question in member.request.questions)
                if (known := by_ids.get(ids)) is None:
                    own = _with_ids_of(answer, shown, member.request)
                    known = by_ids[ids] = (own, encode(Outcome(answer=own)).decode())
                own, outcome = known
                if remember is not None and (member is members[0] or remember.scope == "agent"):
                    extra_keys, extra_args = self._remembering(member.request, own, remember, now_ms, by)
                elif remember is not None:
                    extra_args = [_CARRIED]  # settle.lua writes the first asker's decisions with it if need be
            settlements.append(self._settlement(member, state, outcome, by, extra_keys, extra_args, routed))
        return settlements

    def _settlement(
        self,
        member: Asked,
        state: str,
        outcome: str,
        by: str,
        extra_keys: list[str],
        extra_args: list[Any],
        route: str,
    ) -> SealedSettlement:
        keys, request_id = self.keys, member.request_id
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
                call=self.call_ids.next(),
                asker="verified" if member.verified else "claimed",
                asked=audit.asked_of(member.request),
                route=route,
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

    def _remembering(
        self,
        request: AskUserQuestionRequest,
        answer: AskUserQuestionAnswer,
        remember: Remember,
        now_ms: int,
        by: str,
    ) -> tuple[list[str], list[Any]]:
        if remember.scope == "agent" and not request.agent:
            return [], [0]  # an agentless asker of a coalesced card: agent scope has no agent to remember for
        return settle_extension(
            self.keys, request, answer, remember, signing_key=self.signing_key, now_ms=now_ms, by=by
        )

    async def settle_all(self, settlements: list[SealedSettlement]) -> list[Reply | Refusal]:
        """Settlements (a coalesced card's askers) through settle.lua, a reply for each.

        Those queued meanwhile go in the same call, sealed together under one signature.
        """
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Reply | Refusal]] = []
        for settlement, seal in settlements:
            futures.append(loop.create_future())
            self._queue.append((settlement, seal, futures[-1]))
        if self._running:
            self._queued.set()
        else:
            await self._send_queued()
        if len(futures) == 1:  # the usual case; gather's machinery was 5 % of a busy provider's CPU
            return [await futures[0]]
        return list(await asyncio.gather(*futures))

    async def run(self) -> None:
        """Send what is queued, batch by batch, for as long as the provider runs."""
        self._running = True
        try:
            while True:
                await self._queued.wait()
                self._queued.clear()
                await self._send_queued()
        finally:
            self._running = False

    async def stop(self, within: float) -> None:
        """Stop batching: what is queued or on its way is sent first (for up to ``within`` seconds); what is still
        queued then fails with ``BROKER_UNAVAILABLE``, never a bare cancellation of its caller. A settlement from
        now on is sent by its caller."""
        self._running = False
        try:
            async with asyncio.timeout(within):
                await self._send_queued()  # after the batch ``run`` has on its way (the lock), the rest
        except TimeoutError:
            log.warning("settlements still on their way %.0fs after the provider stopped: given up", within)
        queued, self._queue = self._queue, []
        for _, _, future in queued:
            if not future.done():
                future.set_exception(
                    UserQuestionError("the provider stopped before this settlement was sent", BROKER_UNAVAILABLE)
                )

    async def _send_queued(self) -> None:
        async with self._sending:
            while self._queue:
                batch, self._queue = self._queue[:_SETTLE_BATCH], self._queue[_SETTLE_BATCH:]
                self._carrier = await self._send(batch, self._carrier)

    async def _send(
        self, batch: list[_Queued], carrier: tuple[list[str], list[Any]] | None
    ) -> tuple[list[str], list[Any]] | None:
        """One settle.lua call; the decisions it carried last (a card split across calls carries them again)."""
        settings = self.settings
        first, *_ = batch[0]
        if first.decisions[0] == _CARRIED and carrier is not None:
            # A coalesced card split across calls: this call carries its decisions again (written once).
            carried = msgspec.structs.replace(first, decision_keys=carrier[0], decisions=carrier[1])
            batch[0] = (carried, batch[0][1], batch[0][2])
        for settlement, _, _ in batch:
            if settlement.decisions[0] > 0:
                carrier = (settlement.decision_keys, settlement.decisions)
        lease = self.lease
        # Sealed once per batch, before the first send: a retry after a lost reply sends the same bytes.
        sealed = seal_outcomes(
            self.signing_key, self.keys.namespace, lease.epoch, self.redis_ms(), [s for _, s, _ in batch]
        )
        for (settlement, _, _), outcome in zip(batch, sealed, strict=True):
            settlement.outcome = outcome
        try:
            reply = await settle(
                self.commands,
                **lease.on_stream,
                audit=self.keys.audit,
                decisions=self.keys.decisions,
                decision_expiry=self.keys.decision_expiry,
                provider=lease.name,
                epoch=lease.epoch,
                audit_max=settings.audit_maxlen,
                result_ttl=int(settings.result_ttl * 1000),
                hold_notices="1" if settings.min_replicas else "0",
                settlements=[settlement for settlement, _, _ in batch],
            )
        except BaseException as error:
            told: BaseException = error
            if isinstance(error, asyncio.CancelledError):
                # The sender was stopped (the provider's end, or a caller sending its own): the callers get a
                # coded error, not a cancellation of their own tasks; settle.lua may have run, so say so.
                told = UserQuestionError(
                    "the provider stopped while this settlement was on its way: it may or may not have been applied",
                    BROKER_UNAVAILABLE,
                )
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(told)
            if not isinstance(error, Exception):
                raise
            return carrier
        replies = [reply] * len(batch) if isinstance(reply, Refusal) else reply
        for (_, _, future), one in zip(batch, replies, strict=True):
            if not future.done():
                future.set_result(one)
        return carrier

    async def tell(self, request_id: str, tell: list[tuple[str, str, str]]) -> None:
        """Tell settled askers (request id, outcome, the client its hash names) once replicas have the answer.

        With min_replicas settle.lua held the askers' notices back: they are told only once replicas have it.
        """
        settings = self.settings
        if settings.min_replicas and not await replicated(self.commands, settings, f"the answer to {request_id}"):
            raise UserQuestionError(
                f"request {request_id} is settled, but fewer than {settings.min_replicas} replicas"
                " confirmed it; the asker is told once they do",
                BROKER_UNAVAILABLE,
            )
        for asker_request_id, outcome, client in tell:
            inbox = self.keys.inbox(client)
            await self.commands.call("RPUSH", inbox, f"{asker_request_id} {outcome}")
            await self.commands.call("PEXPIRE", inbox, int(settings.result_ttl * 1000))

    async def record_vote(self, request_id: str, *, person: str, vote: str, policy: str, approving: bool) -> Any:
        """approve.lua: one person's vote on a card, under the fence; every vote so far, flat (field, value, ...)."""
        keys, settings, lease = self.keys, self.settings, self.lease
        votes = await approve(
            self.commands,
            lease=keys.provider,
            request=keys.request(request_id),
            approvals=keys.approvals(request_id),
            audit=keys.audit,
            fence=lease.fence,
            rid=request_id,
            person=person,
            vote=vote,
            ttl=int(settings.result_ttl * 1000),
            audit_max=settings.audit_maxlen,
            policy=policy,
            verdict="approve" if approving else "decline",
            provider=lease.name,
            epoch=lease.epoch,
        )
        if isinstance(votes, Refusal):
            if votes.code == LEASE_LOST:
                lease.fenced()
            raise votes.error()
        return votes

    async def votes(self, request_id: str) -> Any:
        """Every vote on a card so far, flat (field, value, ...), as approve.lua keeps them."""
        return await self.commands.call("HGETALL", self.keys.approvals(request_id))


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
