"""The web provider's broker side: hold the lease, keep the pending list, fan out changes.

``WebProvider.run()`` loops for the life of the app: it stands by for the namespace's
lease, serves the requests delivered while it holds it, and stands by again after it is
fenced (``LEASE_LOST``) or Redis drops. Pages follow along through ``subscribe()``.

Its parts: ``presence`` (where this server stands: serving, standing by, Redis up), ``cards``
(what pages are shown, and what is remembered of cards gone), ``delivery`` (cards as the
provider hands them out, and their askers' changes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager, suppress
from typing import Any

import msgspec

from broker import (
    HANDOVER_GRACE,
    AskUserQuestionAnswer,
    Broker,
    PendingRequest,
    Policies,
    Provider,
    Reads,
    Remember,
    Tally,
    UserQuestionError,
)
from broker.answering.quorum import revoke_covered
from broker.errors import NOT_APPROVER
from workers.answering.web.cards import Cards, Event, filter_tags
from workers.answering.web.delivery import BATCH, Delivery, ready
from workers.answering.web.errors import REDIS_DOWN
from workers.answering.web.history import seen_by
from workers.answering.web.keys import WebKeys
from workers.answering.web.paging import Tag
from workers.answering.web.presence import Presence, Status
from workers.answering.web.settled import NOT_PENDING, AlreadySettled, Settled, settled_in_redis
from workers.metrics import lease_acquired, lease_lost

__all__ = ["QUEUE_SIZE", "AlreadySettled", "Event", "Status", "WebProvider", "filter_tags"]

log = logging.getLogger(__name__)

QUEUE_SIZE = 256
_LEASE_LOST = "LEASE_LOST"


class WebProvider:
    """One lease holder (or standby) per app; the pages' view of its pending requests."""

    def __init__(
        self,
        broker: Broker,
        *,
        name: str,
        keys: WebKeys,
        public_url: str = "",
        retry_delay: float = 1.0,
        policies: Policies | None = None,
        handover_grace: float = HANDOVER_GRACE,
    ) -> None:
        self.broker = broker
        self.handover_grace = handover_grace
        """what a take-over asked here gives a question open at the holder (``Broker.request_handover``)"""
        self.policies = policies or Policies()
        """quorum and routing policies (docs/approvals.md)"""
        self.name = name
        self.keys = keys
        self.public_url = public_url
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self.cards = Cards(broker.namespace, self.policies, self._publish)
        self.presence = Presence(
            broker,
            name=name,
            keys=keys,
            public_url=public_url,
            handover_grace=handover_grace,
            publish=self._publish,
            routes=self.cards.routes_for,
        )
        self._delivery = Delivery(broker, self.cards)
        self._retry_delay = retry_delay
        self._provider: Provider | None = None
        self._running: asyncio.Task[Any] | None = None

    # -- what pages see ---------------------------------------------------------------

    @property
    def status(self) -> Status:
        return self.presence.status

    @property
    def holder(self) -> str:
        return self.presence.holder

    @property
    def redis_ok(self) -> bool:
        return self.presence.redis_ok

    def status_event(self) -> Event:
        return self.presence.status_event()

    async def redis_run(self) -> str | None:
        """Which run of this server's Redis answers (``Presence.redis_run``)."""
        return await self.presence.redis_run()

    def snapshot(self, *, user: str | None = None, window: int | None = None) -> Event:
        """What a page starts from; with ``window``, only the first ``window`` cards ``user`` may see,
        with how many they may see in all (``total``) and the cursor after the last one sent (``after``)."""
        event: Event = {
            "type": "snapshot",
            "namespace": self.broker.namespace,
            "status": self.status_event(),
            "readonly": self.presence.readonly,
            "nowMs": int(time.time() * 1000),
        }
        if window is None:
            return {**event, "requests": self.requests()}
        views, _ = self.page(0, window, lambda view: user is None or self.may_see(view, user))
        after = self.cards.arrivals.seq_of(views[-1]["id"]) if views else 0
        total = len(self.cards.views) if user is None else self.visible_count(user)
        return {**event, "requests": views, "total": total, "after": after, "window": window}

    def visible_count(self, user: str) -> int:
        """How many cards are pending here that ``user`` may see: O(cards routed to a group)."""
        return self.cards.visible_count(user)

    def seq_of(self, request_id: str) -> int | None:
        """Where a pending card stands in the order shown (a cursor for ``page``)."""
        return self.cards.arrivals.seq_of(request_id)

    def requests(self) -> list[dict[str, Any]]:
        """Every pending card's view, in the order shown: urgent first, as ``page`` lists them."""
        return self.cards.requests()

    def page(
        self, after: int, limit: int, wanted: Callable[[dict[str, Any]], bool], among: Collection[Tag] = ()
    ) -> tuple[list[Event], int | None]:
        """Up to ``limit`` wanted views after the cursor ``after``, and the next page's cursor (``Cards.page``)."""
        return self.cards.page(after, limit, wanted, among)

    def built(self, views: list[Event]) -> list[Event]:
        """An ``addedMany`` event's cards with their views built (``Cards.built``): a subscriber reads them so."""
        return self.cards.built(views)

    def may_see(self, event: Event, user: str) -> bool:
        """Routing: whether ``user`` may see the card an event is about (``Cards.may_see``)."""
        return self.cards.may_see(event, user)

    def sees_every_card(self, user: str) -> bool:
        """Whether ``user`` may see every card here, routed or not (``Cards.sees_every_card``)."""
        return self.cards.sees_every_card(user)

    def knows(self, request_id: str) -> bool:
        """Whether the request is pending here or was settled here lately."""
        return self.cards.knows(request_id)

    def pending_request(self, request_id: str) -> PendingRequest | None:
        """The request as delivered, while it is pending here (for another face: Slack)."""
        return self.cards.pending.get(request_id)

    def view_of(self, request_id: str) -> dict[str, Any] | None:
        """What the pages are shown of a pending request."""
        return self.cards.view(request_id, keep=False)

    async def settled_how(self, request_id: str, user: str) -> AlreadySettled:
        """How a request no longer pending here was settled, and by whom, as ``user`` may be told it (another
        face's late click: Slack's); routed like the page's (``_not_pending``)."""
        return await self._not_pending(request_id, user)

    def shown(self, request_id: str) -> dict[str, Any] | None:
        """The view of a request this server showed (pending or recently gone), for the history."""
        return self.cards.recalled(request_id)

    @asynccontextmanager
    async def subscribe(
        self,
        queue: asyncio.Queue[Event | None] | None = None,
        *,
        user: str | None = None,
        window: int | None = None,
    ) -> AsyncIterator[asyncio.Queue[Event | None]]:
        """A queue of change events, starting with a snapshot; ``None`` means: stop.

        Pass a queue to share it between the providers of several namespaces (every event
        names its namespace). With ``window``, the snapshot holds the first ``window`` cards
        ``user`` may see, not all of them (see ``snapshot``). An ``addedMany`` event's cards are read through
        ``built``: a card whose view is built when asked for comes as its id (``Later``).
        """
        queue = queue if queue is not None else asyncio.Queue(QUEUE_SIZE)
        queue.put_nowait(self.snapshot(user=user, window=window))
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    def end_streams(self) -> None:
        """Tell every page's stream to finish (the server is stopping), saying so first: a page shows a
        server stopped on purpose as stopped, not as a lost connection."""
        self.cards.publish({"type": "stopping", "namespace": self.broker.namespace})
        self.cards.publish(None)

    def _publish(self, event: Event | None) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # a stalled page: drop it, its EventSource reconnects
                self._subscribers.discard(queue)
                with suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait(None)

    # -- acting on requests -------------------------------------------------------------

    async def take_over(self, *, by: str) -> None:
        """Ask the lease holder to hand the lease to this server (it stands by meanwhile)."""
        await self.presence.take_over(by=by)

    async def answer(
        self, request_id: str, answer: AskUserQuestionAnswer, *, by: str, remember: Remember | None = None
    ) -> AskUserQuestionAnswer | Tally:
        """The answer as accepted, or, on a card a quorum policy covers, the tally after this vote."""
        async with self._settling(request_id, by) as pending:
            if self.policies.for_card(pending) is not None:
                return self._tallied(pending, await self.policies.vote(pending, answer, by=by, remember=remember))
            route = self.policies.recorded_route(None)  # no policy covers it: routed to nobody
            accepted = await pending.answer(answer, by=by, remember=remember, route=route)
            self.cards.settle(request_id, "answered", by, msgspec.to_builtins(accepted))
            return accepted

    async def cancel(self, request_id: str, message: str, *, by: str) -> Tally | None:
        """Dismiss; on a card a quorum policy covers, a declining vote (the tally after it)."""
        async with self._settling(request_id, by) as pending:
            if self.policies.for_card(pending) is not None:
                return self._tallied(pending, await self.policies.vote(pending, None, by=by, message=message))
            await pending.cancel(message, by=by, route=self.policies.recorded_route(None))
            self.cards.settle(request_id, "cancelled", by)
            return None

    def _tallied(self, pending: PendingRequest, tally: Tally | None) -> Tally:
        """The card shows a vote's tally (``Policies.vote``'s, on a card a policy covers)."""
        assert tally is not None  # the caller saw a policy cover the card
        self.cards.tallied(pending, tally)
        return tally

    @asynccontextmanager
    async def _settling(self, request_id: str, by: str) -> AsyncIterator[PendingRequest]:
        # One settlement at a time per request: the core lets the same holder settle twice
        # (a retry after a lost reply), so two people behind this one provider are told
        # apart here, and the second is told who was first.
        lock = self.cards.locks.setdefault(request_id, asyncio.Lock())
        async with lock:
            provider = self._provider
            if provider is None or provider.lost:
                message = "this web provider does not hold the lease; answers are not accepted"
                raise UserQuestionError(message, _LEASE_LOST)
            pending = self.cards.pending.get(request_id)
            if pending is None:
                raise await self._not_pending(request_id, by)
            if not self.may_see({"routes": self.cards.routes.get(request_id)}, by):
                raise UserQuestionError(f"{by} may not answer {request_id}: it is routed to a group", NOT_APPROVER)
            try:
                yield pending
            except UserQuestionError as error:
                if error.code != NOT_PENDING:
                    raise
                self.cards.remove(request_id, "settled", "")
                raise await self._not_pending(request_id, by) from error

    async def _not_pending(self, request_id: str, user: str) -> AlreadySettled:
        """Who settled a card no longer pending, and how; to ``user`` only if History would show them (routing).
        Every face's late click comes here with the person clicking: nobody is told without being judged."""
        settled = self.cards.settled.get(request_id) or await settled_in_redis(self.broker, request_id)
        if settled is None or not self._may_know(request_id, settled, user):
            return AlreadySettled(f"request {request_id} is not pending here", None)
        by = f" by {settled.by}" if settled.by else ""
        return AlreadySettled(f"request {request_id} was already {settled.state}{by}", settled.view())

    def _may_know(self, request_id: str, settled: Settled, user: str) -> bool:
        shown = self.cards.shown.get(request_id)  # settled here: routed as shown; else as the audit recorded
        routes = (shown.get("routes") or []) if shown is not None else settled.routes
        seen = seen_by({"routes": routes}, user, self.may_see, self.sees_every_card(user))
        return seen is not None and not seen.get("hidden")

    # -- the lease loop ---------------------------------------------------------------

    def let_go(self) -> None:
        """Stop serving at once (SIGTERM): the lease goes to a standby before this server closes its connections."""
        if self._running is not None:
            self._running.cancel()

    async def run(self) -> None:
        """Stand by, serve, and stand by again, until cancelled (or ``let_go``)."""
        self._running = asyncio.current_task()
        try:
            async with asyncio.TaskGroup() as tasks:
                following = tasks.create_task(self.presence.run(), name="qb-web-presence")
                try:
                    await self._serve_forever()
                finally:
                    following.cancel()
        finally:
            self.presence.set_status("stopped")
            self._publish(None)

    async def _serve_forever(self) -> None:
        while True:
            try:
                await self._serve_once()
            except* UserQuestionError as group:
                log.warning("web provider %s stopped serving: %s", self.name, _first(group))
            except* REDIS_DOWN as group:
                log.warning("web provider %s lost Redis: %s", self.name, _first(group))
                self.presence.set_status("connecting")
                await asyncio.sleep(self._retry_delay)
            except* Exception as group:  # a bug must not leave the namespace unserved
                log.error("web provider %s failed; standing by again", self.name, exc_info=group)
                self.presence.set_status("connecting")
                await asyncio.sleep(self._retry_delay)

    async def _serve_once(self) -> None:
        presence = self.presence
        presence.set_status("connecting")
        on_standby: Callable[[str], None] = lambda holder: presence.set_status("standby", holder)  # noqa: E731
        try:
            async with self.broker.provider(self.name, standby=True, on_standby=on_standby) as provider:
                self._provider = provider
                provider.track_changes()  # before the first card is handed out: none of its changes is missed
                lease_acquired(self.broker.namespace)
                presence.set_status("active", self.name)
                if self.policies:
                    forgotten = await revoke_covered(self.policies, self.broker, by=f"{self.name}: quorum policy")
                    if forgotten:
                        log.info("forgot %d remembered decisions a quorum policy covers", len(forgotten))
                try:
                    await self._serve(provider)
                finally:
                    if provider.lost:
                        lease_lost(self.broker.namespace)
                    self._provider = None
        finally:
            # Once the lease is released (leaving the block): taking 100 000 cards down took the best part of a
            # second, which a standby waited out before it could take over.
            self.cards.take_down_all()

    async def _serve(self, provider: Provider) -> None:
        """Show the cards the provider hands out, and follow them, until it ends or loses the lease."""
        async with asyncio.TaskGroup() as tasks:
            if self.cards.lost:
                tasks.create_task(self._resolve_lost(), name="qb-web-resolve-lost")
            watching = tasks.create_task(self._delivery.watch(provider), name="qb-web-watch")
            try:
                while batch := await ready(provider, BATCH):
                    await self._delivery.add_batch(batch)
            finally:
                watching.cancel()

    async def _resolve_lost(self) -> None:
        """Serving again: say what became of each request lost with the lease, unless it is still pending.

        A pending one is redelivered (and shown again); one withdrawn, answered or expired meanwhile
        is announced as removed with that reason, so a page says so instead of dropping it silently.
        """
        lost = self.cards.lost
        for request_id in list(lost):
            try:
                state = await Reads(self.broker).request_state(request_id)
            except (*REDIS_DOWN, UserQuestionError) as error:
                log.debug("cannot tell what became of %s: %s", request_id, error)
                continue
            if state == "pending" or request_id not in lost:
                continue
            lost.discard(request_id)
            settled = await settled_in_redis(self.broker, request_id)
            reason, by = (settled.state, settled.by) if settled is not None else ("gone", "")
            removed = {"type": "removed", "id": request_id, "reason": reason, "by": by}
            self.cards.publish(
                {**removed, "settled": settled.view() if settled else None, "namespace": self.broker.namespace}
            )


def _first(error: BaseException) -> BaseException:
    """The first leaf of a (nested) exception group, for a one-line log."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
