"""Cards as the lease holder is handed them: shown in batches with what the agent records add, kept up to
date as askers go away, come back, join or leave, and widened to the escalation group when a policy says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from broker import Broker, PendingRequest, Provider, Reads, UserQuestionError
from workers.answering.web.cards import Cards, Event, Unbuilt, card_tags
from workers.answering.web.errors import REDIS_DOWN
from workers.answering.web.render import asking_view, request_view

__all__ = ["BATCH", "Delivery", "ready"]

log = logging.getLogger(__name__)

BATCH = 500
"""at most this many cards ready at once (a failover's backlog) have their context read in one pipeline
and go to pages as one event: the first page is shown within a second of taking the lease, not after
every card's own round trips, and a page's queue (``QUEUE_SIZE`` events) is not flooded"""
_OWNERS_FRESH_S = 1.0
"""an agent's owner read this long ago is read again: a failover's backlog (hundreds of batches, each
with cards of most agents) reads each agent's owner about once a second, not once a batch"""


async def ready(provider: Provider, most: int) -> list[PendingRequest]:
    """The next card (waited for), with up to ``most - 1`` more already waiting; empty once the provider
    ends (a hand-over). Raises ``LEASE_LOST`` only before any card is taken (the next call raises it)."""
    try:
        first = await anext(provider)
    except StopAsyncIteration:
        return []
    return [first, *provider.take_ready(most - 1)]


class Delivery:
    """Shows the cards delivered to this server's provider on ``cards``, and follows each one's askers."""

    def __init__(self, broker: Broker, cards: Cards) -> None:
        self.broker = broker
        self.cards = cards
        self._reads = Reads(broker)
        self._owners: dict[str, str | None] = {}
        """agent id -> its owner, as read since ``_owners_read`` (``_OWNERS_FRESH_S``)"""
        self._owners_read = 0.0

    async def add_batch(self, batch: list[PendingRequest]) -> None:
        """Show cards delivered together: their context in one pipeline, then one event for pages."""
        contexts = await self._contexts(batch)
        added = [(pending, view) for pending in batch if (view := await self._add(pending, contexts)) is not None]
        # A card withdrawn or settled while a later one of the batch was read is not shown any more.
        views = [view for pending, view in added if self.cards.pending.get(pending.request_id) is pending]
        if len(views) == 1:
            self.cards.publish({"type": "added", "request": self.cards.built(views)[0]})
        elif views:
            self.cards.publish({"type": "addedMany", "namespace": self.broker.namespace, "requests": views})

    async def _add(self, pending: PendingRequest, contexts: dict[str, Event]) -> Event | None:
        """What pages are told of the card, now shown here (None: not shown); the caller tells the pages. A card
        whose view nothing changes once shown (no policy covers it, an asker waits) is told as a ``Later``: its
        view is built for a page it is sent to, not for each card of a failover's backlog (``Cards.built``)."""
        context = contexts.get(pending.request_id, {})
        policies = self.cards.policies
        policy = policies.for_card(pending)
        if policy is None and not pending.asker_away:
            if pending.is_withdrawn:
                return None
            try:
                return self.cards.show(pending, None, owner=context.get("owner"))
            except Exception:  # never let one odd request stop the others being served
                log.exception("cannot show request %s", pending.request_id)
                return None
        try:
            view = request_view(pending)
        except Exception:  # never let one odd request stop the others being served
            log.exception("cannot show request %s", pending.request_id)
            return None
        view.update(context, namespace=self.broker.namespace)
        if policy is not None:
            try:
                tally = await policies.current(pending)  # votes given before a failover; may settle it
            except (*REDIS_DOWN, UserQuestionError) as error:
                log.warning("no votes so far for %s: %s", pending.request_id, error)
                return None  # delivered again once the lease (or Redis) is back
            assert tally is not None
            if tally.decided is not None:
                self.cards.tallied(pending, tally)
                return None
            routes = list(policies.routed_to(policy, tally.escalated))
            view.update(quorum=tally.view(), remember=[], route=policy.route or None, routes=routes or None)
            if routes:
                self.cards.routes[pending.request_id] = routes
            delay = policy.escalates_in(pending)
            if delay is not None and pending.request_id not in self.cards.escalations:
                self.cards.escalations[pending.request_id] = asyncio.create_task(self._escalate(pending, delay))
        if pending.is_withdrawn:
            return None
        away_until = await self._away_until(pending) if pending.asker_away else None
        if pending.is_withdrawn:
            return None
        # Who asks may have changed while the votes or the grace were read (an asker joined or went
        # away), and the watcher found no view to update then: take it now.
        view.update(askerAway=pending.asker_away, awayUntilMs=away_until, **asking_view(pending))
        return self.cards.show(pending, view, owner=context.get("owner"))

    async def _escalate(self, pending: PendingRequest, delay: float) -> None:
        """Once the card waited its policy's delay, its escalation group may answer too: show it to them."""
        request_id, policies, cards = pending.request_id, self.cards.policies, self.cards
        try:
            await asyncio.sleep(delay)
            policy = policies.for_card(pending)
            if policy is None or request_id not in cards.pending:
                return
            try:
                tally = await policies.current(pending)
            except (*REDIS_DOWN, UserQuestionError) as error:
                log.warning("cannot escalate %s: %s", request_id, error)
                return  # shown escalated when it is delivered again
            if tally is None or request_id not in cards.pending:
                return
            if tally.decided is not None:
                cards.tallied(pending, tally)
                return
            routes = list(policies.routed_to(policy, escalated=True))
            view = cards.view(request_id)
            assert view is not None  # pending here (checked above, no await since)
            view.update(quorum=tally.view(), routes=routes or None)
            if routes:
                cards.routes[request_id] = routes
            log.info("%s escalated to %s (policy %r)", request_id, policy.escalate_to, policy.name)
            # "added": the escalation group's pages never had the card; the others' bring theirs up to date
            cards.publish({"type": "added", "request": view})
        finally:
            if cards.escalations.get(request_id) is asyncio.current_task():
                del cards.escalations[request_id]

    async def _contexts(self, batch: list[PendingRequest]) -> dict[str, Event]:
        """What the agent records add, by request id: the agent's owner, one command per agent, sent
        together (one pipeline); and the asker's deadline (delivered with the card)."""
        if time.monotonic() - self._owners_read > _OWNERS_FRESH_S:
            self._owners.clear()
            self._owners_read = time.monotonic()
        owners = self._owners
        agents = list({pending.agent_id for pending in batch if pending.agent_id and pending.agent_id not in owners})
        try:
            replies = await self._reads.agent_owners(agents)
        except (*REDIS_DOWN, UserQuestionError) as error:
            log.warning("no owner for %d requests: %s", len(batch), error)
            owners = {**owners, **dict.fromkeys(agents)}  # not kept: read again with the next batch
        else:
            owners.update(zip(agents, replies, strict=True))
        return {
            pending.request_id: {
                "deadlineMs": pending.deadline_ms,
                "owner": owners.get(pending.agent_id or "") or None,
            }
            for pending in batch
        }

    async def _away_until(self, pending: PendingRequest) -> int | None:
        """When an away card's detach grace ends (unix ms, the last of its askers'), for its countdown."""
        if not pending.asker_away:
            return None
        request_ids = [asker.request_id for asker in pending.askers]
        try:
            scores = await self._reads.away_until(request_ids)
        except (*REDIS_DOWN, UserQuestionError) as error:
            log.warning("no detach grace for %s: %s", pending.request_id, error)
            return None
        ends = [int(score) for score in scores if score is not None]
        return max(ends) if ends else None

    async def watch(self, provider: Provider) -> None:
        """Take cards down when withdrawn; say when an asker goes away or comes back (one task for every card)."""
        while True:
            changed: list[PendingRequest] = []
            for pending in await provider.changes():
                if self.cards.pending.get(pending.request_id) is not pending:
                    continue  # not shown yet (``_add`` reads what is true when it shows it), or gone already
                if pending.is_withdrawn:
                    self.cards.remove(pending.request_id, "withdrawn", "")
                else:
                    pending.changed.clear()
                    changed.append(pending)
            if len(changed) == 1:
                await self._asker_changed(changed[0])
            elif changed:
                await asyncio.gather(*(self._asker_changed(pending) for pending in changed))

    async def _asker_changed(self, pending: PendingRequest) -> None:
        """An asker went away or came back, joined or left the card, or raised its priority."""
        cards = self.cards
        if pending.request_id not in cards.views:
            return
        away_until = await self._away_until(pending)
        built = not isinstance(cards.views.get(pending.request_id), Unbuilt)
        view = cards.view(pending.request_id)
        if view is None:
            return
        now: dict[str, Any] = {"askerAway": pending.asker_away, "awayUntilMs": away_until, **asking_view(pending)}
        level = cards.arrivals.level_of(pending.request_id)
        moved = level is not None and level != pending.level
        tags = card_tags({**view, **now})  # who asks, and how urgently, may have changed: the API's filters follow
        if moved:  # an urgent asker joined (or left): the card takes its place among the cards of its new level
            cards.arrivals.add(pending.request_id, pending.level, tags)
        else:
            cards.arrivals.retag(pending.request_id, tags)
        # An unbuilt view is built from what is true now: the pages were shown what was true before, so they are told.
        if built and not moved and all(view.get(name) == value for name, value in now.items()):
            return
        view.update(now)
        cards.publish({"type": "updated", "id": pending.request_id, **now, "namespace": self.broker.namespace})
        if moved and pending.level < (level or 0):  # a page whose window did not reach it may hold cards it now goes
            cards.publish({"type": "added", "request": view})  # ahead of: sent in full there (window.py)
