"""The web provider's broker side: hold the lease, keep the pending list, fan out changes.

``WebProvider.run()`` loops for the life of the app: it stands by for the namespace's
lease, serves the requests delivered while it holds it, and stands by again after it is
fenced (``LEASE_LOST``) or Redis drops. Pages follow along through ``subscribe()``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker import (
    HANDOVER_GRACE,
    AskUserQuestionAnswer,
    Broker,
    PendingRequest,
    Policies,
    Provider,
    Remember,
    Tally,
    UserQuestionError,
)
from broker.errors import NOT_APPROVER
from broker.quorum import revoke_covered
from broker.types import PRIORITIES, decode_request
from workers.answering.web.history import find_settlement, outcome_json
from workers.answering.web.keys import WebKeys
from workers.answering.web.paging import Arrivals, Tag
from workers.answering.web.render import asking_view, plan_review, readonly_view, request_view, safe_url
from workers.inert import inert
from workers.metrics import lease_acquired, lease_lost

__all__ = ["QUEUE_SIZE", "AlreadySettled", "Event", "Status", "WebProvider", "filter_tags"]

log = logging.getLogger(__name__)

Status = Literal["connecting", "standby", "active", "stopped"]
Event = dict[str, Any]

_SETTLED_MEMORY = 2_000
QUEUE_SIZE = 256
_PROBE_EVERY_S = 1.0
_PROBE_TIMEOUT_S = 1.5
_RUN_TIMEOUT_S = 0.5
"""how often and how patiently Redis is pinged, so pages learn of an outage in seconds, not after
the broker's own retries (``unavailable_after``) give up"""
_READONLY_EVERY_S = 1.0
_READONLY_MAX = 500
"""while standing by, the holder's pending requests are read this often, this many at most, to list them read-only"""
_BATCH = 500
"""at most this many cards ready at once (a failover's backlog) have their context read in one pipeline
and go to pages as one event: the first page is shown within a second of taking the lease, not after
every card's own round trips, and a page's queue (``QUEUE_SIZE`` events) is not flooded"""
_OWNERS_FRESH_S = 1.0
"""an agent's owner read this long ago is read again: a failover's backlog (hundreds of batches, each
with cards of most agents) reads each agent's owner about once a second, not once a batch"""
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
_NOT_PENDING, _LEASE_LOST, _NOT_STANDING_BY = "NOT_PENDING", "LEASE_LOST", "NOT_STANDING_BY"


def filter_tags(*, agent: str | None = None, priority: str | None = None, intent: str | None = None) -> list[Tag]:
    """The tags every card an API filter keeps is filed under (``_tags``): its page walks the shortest line of them."""
    return [
        *([("agent", agent)] if agent is not None else []),
        *([("priority", priority)] if priority is not None else []),
        *([("intent", intent)] if intent is not None else []),
    ]


def _tags(view: dict[str, Any]) -> frozenset[Tag]:
    """What the API's filters read of a card's view (``app._requests_page``): each agent that asks it (the card's
    and its coalesced askers'), its priority, each kind of its questions."""
    agents = (view["agent"], *(asker["agent"] for asker in view["askers"]))
    kinds = tuple("plan-review" if question.get("planReview") else "none" for question in view["questions"])
    return _tagset(agents, view["priority"], kinds)


@functools.lru_cache(maxsize=4096)
def _tagset(agents: tuple[str | None, ...], priority: str, kinds: tuple[str, ...]) -> frozenset[Tag]:
    """One set shared by the cards of the same tags (an agent's many cards): 100 000 cards hold no set each."""
    return frozenset((*(("agent", agent) for agent in agents), ("priority", priority), *(("intent", k) for k in kinds)))


class _Unbuilt:
    """A card shown here whose view is built when something asks for it: 100 000 pending cards hold no
    view each (about 1 KB a card), only this marker, one shared by every card of the same owner. Only a
    card whose view nothing changes after it is shown (no quorum policy, no asker away) is left unbuilt;
    its view is what it would have been when shown, built from the delivered request."""

    __slots__ = ("owner",)

    def __init__(self, owner: str | None) -> None:
        self.owner = owner


@dataclass(frozen=True)
class _Settled:
    state: str
    by: str
    answer: Any = None
    """the accepted answer as JSON-ready data, when it was answered"""

    def view(self) -> Event:
        """What pages are told of it: the answer's labels and text as a page shows them (``workers.inert``)."""
        return {"state": self.state, "by": self.by, "answer": _shown_answer(self.answer)}


def _shown_answer(answer: Any) -> Any:
    if not isinstance(answer, dict) or not isinstance(answer.get("answers"), list):
        return answer
    items = []
    for item in answer["answers"]:
        if isinstance(item, dict):
            item = dict(item)
            if isinstance(item.get("selected"), list):
                item["selected"] = [inert(label) if isinstance(label, str) else label for label in item["selected"]]
            if isinstance(item.get("custom"), str):
                item["custom"] = inert(item["custom"])
        items.append(item)
    return {**answer, "answers": items}


class AlreadySettled(UserQuestionError):
    """``NOT_PENDING`` that says who was first and what they answered (``winner``)."""

    def __init__(self, message: str, winner: Event | None) -> None:
        super().__init__(message, _NOT_PENDING)
        self.winner = winner


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
        self._routes: dict[str, list[str]] = {}
        """request id -> the groups its card is routed to (the escalation group joins later), while it is shown"""
        self._escalations: dict[str, asyncio.Task[None]] = {}
        """request id -> the timer that widens who may answer its card (a policy's ``escalate``)"""
        self.name = name
        self.keys = keys
        self.public_url = public_url
        self.status: Status = "connecting"
        self.holder = ""
        self.holder_url = ""
        self.redis_ok = True
        self._redis_run: tuple[float, str | None] = (-_PROBE_EVERY_S, None)
        """when ``redis_run`` last read it (the loop's time), and what it read"""
        self._status_changed = asyncio.Event()
        self._holder_changed = asyncio.Event()
        self._retry_delay = retry_delay
        self._provider: Provider | None = None
        self._pending: dict[str, PendingRequest] = {}
        self._views: dict[str, dict[str, Any] | _Unbuilt] = {}
        """request id -> what pages are shown of it (built when first asked for: ``_view``)"""
        self._unbuilt: dict[str | None, _Unbuilt] = {}
        """owner -> the marker its cards share while their views are not built"""
        self._owners: dict[str, str | None] = {}
        """agent id -> its owner, as read since ``_owners_read`` (``_OWNERS_FRESH_S``)"""
        self._owners_read = 0.0
        self._arrivals = Arrivals()
        """the ids of ``_views`` in the order shown (urgent first), for the API's pages and the pages' windows"""
        self._locks: dict[str, asyncio.Lock] = {}
        self._settled: OrderedDict[str, _Settled] = OrderedDict()
        self._shown: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lost: set[str] = set()
        """requests taken down when the lease was lost: each comes back (redelivered) or is said to be gone"""
        self._subscribers: set[asyncio.Queue[Event | None]] = set()
        self._readonly: list[dict[str, Any]] = []
        """while standing by: the requests the holder serves, listed read-only"""
        self.takeover_by = ""
        """who asked, here, for the lease (cleared once this server serves, or stops standing by)"""
        self._running: asyncio.Task[Any] | None = None
        self._takeover_until = 0.0
        """when (loop time) the take-over asked here should have completed (``Broker.handover_within``)"""
        self.takeover_late = False
        """the take-over asked here is past that bound and the holder still holds the lease"""

    # -- what pages see ---------------------------------------------------------------

    def snapshot(self, *, user: str | None = None, window: int | None = None) -> Event:
        """What a page starts from; with ``window``, only the first ``window`` cards ``user`` may see,
        with how many they may see in all (``total``) and the cursor after the last one sent (``after``)."""
        event: Event = {
            "type": "snapshot",
            "namespace": self.broker.namespace,
            "status": self.status_event(),
            "readonly": self._readonly,
            "nowMs": int(time.time() * 1000),
        }
        if window is None:
            return {**event, "requests": self.requests()}
        views, _ = self.page(0, window, lambda view: user is None or self.may_see(view, user))
        after = self._arrivals.seq_of(views[-1]["id"]) if views else 0
        total = len(self._views) if user is None else self.visible_count(user)
        return {**event, "requests": views, "total": total, "after": after, "window": window}

    def visible_count(self, user: str) -> int:
        """How many cards are pending here that ``user`` may see: O(cards routed to a group)."""
        hidden = sum(1 for routes in self._routes.values() if not self.may_see({"routes": routes}, user))
        return len(self._views) - hidden

    def seq_of(self, request_id: str) -> int | None:
        """Where a pending card stands in the order shown (a cursor for ``page``)."""
        return self._arrivals.seq_of(request_id)

    def status_event(self) -> Event:
        return {
            "type": "status",
            "namespace": self.broker.namespace,
            "status": self.status,
            "holder": self.holder,
            "holderUrl": self.holder_url if self.status == "standby" else "",
            "name": self.name,
            "redis": "ok" if self.redis_ok else "down",
            "takeoverBy": self.takeover_by if self.status == "standby" else "",
            "takeoverWithinS": round(self.broker.handover_within(self.handover_grace)),
            "takeoverGraceS": self.handover_grace,
            "takeoverLate": self.takeover_late and self.status == "standby",
        }

    def requests(self) -> list[dict[str, Any]]:
        """Every pending card's view, in the order shown: urgent first, as ``page`` lists them."""
        ids = [request_id for _, request_id in self._arrivals.after(0)]
        return [view for request_id in ids if (view := self._view(request_id, keep=False)) is not None]

    def _view(self, request_id: str, *, keep: bool = True) -> dict[str, Any] | None:
        """What pages are shown of a pending card; ``keep``: an unbuilt view is kept once built (to change it)."""
        view = self._views.get(request_id)
        if not isinstance(view, _Unbuilt):
            return view
        built = self._build_view(self._pending[request_id], view.owner)
        if keep:
            self._views[request_id] = built
        return built

    def _filtered(self, pending: PendingRequest) -> dict[str, Any]:
        """The fields of a card's view that page filters read (the API's agent, priority and intent, routing):
        who asks, how urgently, which questions are plan reviews. An unbuilt card has no route (a routed card's
        view is kept built)."""
        questions = pending.request.questions
        return {
            "id": pending.request_id,
            "agent": None if pending.agent_id is None else inert(pending.agent_id),  # as the built view shows it
            **asking_view(pending),
            "questions": [{"planReview": plan_review(item, len(questions))} for item in questions],
        }

    def _build_view(self, pending: PendingRequest, owner: str | None) -> dict[str, Any]:
        view = request_view(pending)
        view.update(deadlineMs=pending.deadline_ms, owner=owner, namespace=self.broker.namespace, awayUntilMs=None)
        return view

    def page(
        self, after: int, limit: int, wanted: Callable[[dict[str, Any]], bool], among: Collection[Tag] = ()
    ) -> tuple[list[Event], int | None]:
        """Up to ``limit`` views shown after the cursor ``after`` that are ``wanted``, in the order shown,
        and the cursor of the next page (None: this was the last). ``among``: tags every wanted card is filed
        under (``filter_tags``): only the cards of the shortest of their lines are judged, not every pending one."""
        views: list[Event] = []
        last = after
        tag = min(among, key=self._arrivals.filed) if among else None
        for seq, request_id in self._arrivals.after(after, tag):
            view = self._views.get(request_id)
            if isinstance(view, _Unbuilt):
                # Judged first on what filters read: a view is built only for a card that is wanted, so a
                # filter matching a few of 100 000 cards does not build a view for every card it passes.
                if not wanted(self._filtered(self._pending[request_id])):
                    continue
                view = self._view(request_id, keep=False)
            if view is None or not wanted(view):
                continue
            if len(views) == limit:
                return views, last
            views.append(view)
            last = seq
        return views, None

    def knows(self, request_id: str) -> bool:
        """Whether the request is pending here or was settled here lately."""
        return request_id in self._pending or request_id in self._settled

    def pending_request(self, request_id: str) -> PendingRequest | None:
        """The request as delivered, while it is pending here (for another face: Slack)."""
        return self._pending.get(request_id)

    def view_of(self, request_id: str) -> dict[str, Any] | None:
        """What the pages are shown of a pending request."""
        return self._view(request_id, keep=False)

    async def settled_how(self, request_id: str) -> AlreadySettled:
        """How a request no longer pending here was settled, and by whom (when known)."""
        return await self._not_pending(request_id)

    def shown(self, request_id: str) -> dict[str, Any] | None:
        """The view of a request this server showed (pending or recently gone), for the history."""
        return self._view(request_id, keep=False) or self._shown.get(request_id)

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
        ``user`` may see, not all of them (see ``snapshot``).
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
        self._publish({"type": "stopping", "namespace": self.broker.namespace})
        self._publish(None)

    def _publish(self, event: Event | None) -> None:
        if event is not None and "id" in event and event["id"] in self._routes:
            routes = self._routes[event["id"]]
            event = {**event, "route": routes[0], "routes": routes}
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # a stalled page: drop it, its EventSource reconnects
                self._subscribers.discard(queue)
                with suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait(None)

    def _set_status(self, status: Status, holder: str = "") -> None:
        if (status, holder) != (self.status, self.holder):
            self.holder_url = ""
        if status != "standby":
            self.takeover_by, self.takeover_late = "", False
        self.status, self.holder = status, holder
        self._status_changed.set()
        self._holder_changed.set()
        self._publish(self.status_event())

    # -- acting on requests -------------------------------------------------------------

    async def take_over(self, *, by: str) -> None:
        """Ask the lease holder to hand the lease to this server (it stands by meanwhile)."""
        if self.status != "standby":
            raise UserQuestionError("this server is not standing by behind another provider", _NOT_STANDING_BY)
        await self.broker.request_handover(self.name, by=by, grace=self.handover_grace)
        log.info("%s asked %s to hand the lease of %s to %s", by, self.holder, self.broker.namespace, self.name)
        self.takeover_by, self.takeover_late = by, False
        self._takeover_until = asyncio.get_running_loop().time() + self.broker.handover_within(self.handover_grace)
        self._publish(self.status_event())

    def _check_takeover(self) -> None:
        """Past the bound a take-over asked here should have met, say so once (the page says why and what to do)."""
        late = bool(self.takeover_by) and asyncio.get_running_loop().time() > self._takeover_until
        if late and not self.takeover_late and self.status == "standby":
            log.warning("%s has not handed the lease of %s over to %s", self.holder, self.broker.namespace, self.name)
            self.takeover_late = True
            self._publish(self.status_event())

    async def answer(
        self, request_id: str, answer: AskUserQuestionAnswer, *, by: str, remember: Remember | None = None
    ) -> AskUserQuestionAnswer | Tally:
        """The answer as accepted, or, on a card a quorum policy covers, the tally after this vote."""
        async with self._settling(request_id, by) as pending:
            if self.policies.for_card(pending) is not None:
                return await self._vote(pending, answer, by=by, remember=remember)
            accepted = await pending.answer(answer, by=by, remember=remember)
            self._settle(request_id, "answered", by, msgspec.to_builtins(accepted))
            return accepted

    async def cancel(self, request_id: str, message: str, *, by: str) -> Tally | None:
        """Dismiss; on a card a quorum policy covers, a declining vote (the tally after it)."""
        async with self._settling(request_id, by) as pending:
            if self.policies.for_card(pending) is not None:
                return await self._vote(pending, None, by=by, message=message)
            await pending.cancel(message, by=by)
            self._settle(request_id, "cancelled", by)
            return None

    async def _vote(
        self,
        pending: PendingRequest,
        answer: AskUserQuestionAnswer | None,
        *,
        by: str,
        message: str = "",
        remember: Remember | None = None,
    ) -> Tally:
        tally = await self.policies.vote(pending, answer, by=by, message=message, remember=remember)
        assert tally is not None  # the caller saw a policy cover the card
        self._tallied(pending, tally)
        return tally

    def _tallied(self, pending: PendingRequest, tally: Tally) -> None:
        """Show the votes so far, or settle the card here once they decide it."""
        request_id = pending.request_id
        decided = tally.decided
        if decided is None:
            view = self._view(request_id)
            if view is not None:
                view["quorum"] = tally.view()
                now = {
                    "askerAway": pending.asker_away,
                    "awayUntilMs": view.get("awayUntilMs"),
                    **asking_view(pending),
                    "quorum": view["quorum"],
                }
                self._publish({"type": "updated", "id": request_id, **now, "namespace": self.broker.namespace})
        elif decided.answer is None:
            self._settle(request_id, "cancelled", ", ".join(tally.by))
        else:
            self._settle(request_id, "answered", ", ".join(tally.by), msgspec.to_builtins(decided.answer))

    def may_see(self, event: Event, user: str) -> bool:
        """Routing: an event about a card routed to a group goes to its members only (and, once the card
        escalated, to the escalation group's)."""
        request = event.get("request") or {}
        routes = event.get("routes") or request.get("routes")
        if not routes:
            route = event.get("route") or request.get("route")
            routes = [route] if route else []
        return not routes or any(user in self.policies.groups.get(group, frozenset()) for group in routes)

    @asynccontextmanager
    async def _settling(self, request_id: str, by: str) -> AsyncIterator[PendingRequest]:
        # One settlement at a time per request: the core lets the same holder settle twice
        # (a retry after a lost reply), so two people behind this one provider are told
        # apart here, and the second is told who was first.
        lock = self._locks.setdefault(request_id, asyncio.Lock())
        async with lock:
            provider = self._provider
            if provider is None or provider.lost:
                message = "this web provider does not hold the lease; answers are not accepted"
                raise UserQuestionError(message, _LEASE_LOST)
            pending = self._pending.get(request_id)
            if pending is None:
                raise await self._not_pending(request_id)
            if not self.may_see({"routes": self._routes.get(request_id)}, by):
                raise UserQuestionError(f"{by} may not answer {request_id}: it is routed to a group", NOT_APPROVER)
            try:
                yield pending
            except UserQuestionError as error:
                if error.code != _NOT_PENDING:
                    raise
                self._remove(request_id, "settled", "")
                raise await self._not_pending(request_id) from error

    async def _not_pending(self, request_id: str) -> AlreadySettled:
        settled = self._settled.get(request_id) or await self._settled_in_redis(request_id)
        if settled is None:
            return AlreadySettled(f"request {request_id} is not pending here", None)
        by = f" by {settled.by}" if settled.by else ""
        return AlreadySettled(f"request {request_id} was already {settled.state}{by}", settled.view())

    async def _settled_in_redis(self, request_id: str) -> _Settled | None:
        """How a request this server does not remember was settled (by another server, say)."""
        keys, call = self.broker.keys, self.broker.commands.call
        try:
            (state, by), outcome = await asyncio.gather(
                call("HMGET", keys.request(request_id), "state", "by"), call("GET", keys.outcome(request_id))
            )
            if not state or (state != "pending" and not outcome):
                # The asker has read its outcome: the hash is gone or a slim tombstone, and the
                # outcome key too. The audit stream holds what was answered and by whom.
                found = await find_settlement(self.broker, request_id)
                if found is not None:
                    return _Settled(*found)
                if not state:
                    return None
        except (*_REDIS_DOWN, UserQuestionError):
            return None
        if state == "pending":
            return None
        return _Settled(str(state), str(by or ""), outcome_json(outcome).get("answer"))

    def _settle(self, request_id: str, state: str, by: str, answer: Any = None) -> None:
        settled = _Settled(state, by, answer)
        self._settled[request_id] = settled
        while len(self._settled) > _SETTLED_MEMORY:
            self._settled.popitem(last=False)
        self._remove(request_id, state, by, settled.view())

    async def _add_batch(self, batch: list[PendingRequest]) -> None:
        """Show cards delivered together: their context in one pipeline, then one event for pages."""
        contexts = await self._contexts(batch)
        added = [(pending, view) for pending in batch if (view := await self._add(pending, contexts)) is not None]
        # A card withdrawn or settled while a later one of the batch was read is not shown any more.
        views = [view for pending, view in added if self._pending.get(pending.request_id) is pending]
        if len(views) == 1:
            self._publish({"type": "added", "request": views[0]})
        elif views:
            self._publish({"type": "addedMany", "namespace": self.broker.namespace, "requests": views})

    async def _add(self, pending: PendingRequest, contexts: dict[str, Event]) -> Event | None:
        """The card's view, now shown here (None: not shown); the caller tells the pages."""
        try:
            view = request_view(pending)
        except Exception:  # never let one odd request stop the others being served
            log.exception("cannot show request %s", pending.request_id)
            return None
        context = contexts.get(pending.request_id, {})
        view.update(context, namespace=self.broker.namespace)
        policy = self.policies.for_card(pending)
        if policy is not None:
            try:
                tally = await self.policies.current(pending)  # votes given before a failover; may settle it
            except (*_REDIS_DOWN, UserQuestionError) as error:
                log.warning("no votes so far for %s: %s", pending.request_id, error)
                return None  # delivered again once the lease (or Redis) is back
            assert tally is not None
            if tally.decided is not None:
                self._tallied(pending, tally)
                return None
            routes = list(self.policies.routed_to(policy, tally.escalated))
            view.update(quorum=tally.view(), remember=[], route=policy.route or None, routes=routes or None)
            if routes:
                self._routes[pending.request_id] = routes
            delay = policy.escalates_in(pending)
            if delay is not None and pending.request_id not in self._escalations:
                self._escalations[pending.request_id] = asyncio.create_task(self._escalate(pending, delay))
        if pending.is_withdrawn:
            return None
        suspended = policy is not None or pending.asker_away
        away_until = await self._away_until(pending) if pending.asker_away else None
        if pending.is_withdrawn:
            return None
        if suspended:
            # Who asks may have changed while the votes or the grace were read (an asker joined or went
            # away), and the watcher found no view to update then: take it now.
            view.update(askerAway=pending.asker_away, awayUntilMs=away_until, **asking_view(pending))
        else:
            view.update(awayUntilMs=None)
        self._lost.discard(pending.request_id)
        self._pending[pending.request_id] = pending
        if suspended:
            self._views[pending.request_id] = view
        else:  # built again when asked for: ``view`` goes to the pages that are told of it, then is let go
            owner = context.get("owner")
            self._views[pending.request_id] = self._unbuilt.setdefault(owner, _Unbuilt(owner))
        self._arrivals.add(pending.request_id, pending.level, _tags(view))
        return view

    async def _escalate(self, pending: PendingRequest, delay: float) -> None:
        """Once the card waited its policy's delay, its escalation group may answer too: show it to them."""
        request_id = pending.request_id
        try:
            await asyncio.sleep(delay)
            policy = self.policies.for_card(pending)
            if policy is None or request_id not in self._pending:
                return
            try:
                tally = await self.policies.current(pending)
            except (*_REDIS_DOWN, UserQuestionError) as error:
                log.warning("cannot escalate %s: %s", request_id, error)
                return  # shown escalated when it is delivered again
            if tally is None or request_id not in self._pending:
                return
            if tally.decided is not None:
                self._tallied(pending, tally)
                return
            routes = list(self.policies.routed_to(policy, escalated=True))
            view = self._view(request_id)
            assert view is not None  # pending here (checked above, no await since)
            view.update(quorum=tally.view(), routes=routes or None)
            if routes:
                self._routes[request_id] = routes
            log.info("%s escalated to %s (policy %r)", request_id, policy.escalate_to, policy.name)
            # "added": the escalation group's pages never had the card; the others' bring theirs up to date
            self._publish({"type": "added", "request": view})
        finally:
            if self._escalations.get(request_id) is asyncio.current_task():
                del self._escalations[request_id]

    async def _contexts(self, batch: list[PendingRequest]) -> dict[str, Event]:
        """What the agent records add, by request id: the agent's owner, one command per agent, sent
        together (one pipeline); and the asker's deadline (delivered with the card)."""
        keys, send = self.broker.keys, self.broker.commands.send
        if time.monotonic() - self._owners_read > _OWNERS_FRESH_S:
            self._owners.clear()
            self._owners_read = time.monotonic()
        owners = self._owners
        agents = list({pending.agent_id for pending in batch if pending.agent_id and pending.agent_id not in owners})
        try:
            replies = await asyncio.gather(*(send("HGET", keys.agent(agent_id), "owner") for agent_id in agents))
        except (*_REDIS_DOWN, UserQuestionError) as error:
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
            scores = await self.broker.commands.call("ZMSCORE", self.broker.keys.away, *request_ids)
        except (*_REDIS_DOWN, UserQuestionError) as error:
            log.warning("no detach grace for %s: %s", pending.request_id, error)
            return None
        ends = [int(float(score)) for score in scores or () if score is not None]
        return max(ends) if ends else None

    def _remove(self, request_id: str, reason: str, by: str, settled: Event | None = None) -> None:
        pending = self._pending.pop(request_id, None)
        self._locks.pop(request_id, None)
        view = self._views.pop(request_id, None)
        self._arrivals.remove(request_id)
        if view is not None:
            if isinstance(view, _Unbuilt):  # read off the card: a lost lease takes 100 000 down, no view built each
                assert pending is not None  # an unbuilt view is a pending card's
                count = len(pending.request.questions)
                agent = pending.agent_id
                questions = [
                    {
                        "id": item.id,
                        "question": inert(item.question),
                        "approve": (plan_review(item, count) or {}).get("approve"),
                    }
                    for item in pending.request.questions
                ]
                askers = [(asker.agent_id, asker.request_id) for asker in pending.askers]
            else:
                agent = view["agent"]
                questions = [
                    {"id": q["id"], "question": q["question"], "approve": (q.get("planReview") or {}).get("approve")}
                    for q in view["questions"]
                ]
                askers = [(asker.get("agent"), asker.get("requestId")) for asker in view.get("askers", ())]
            self._shown[request_id] = {"agent": agent, "questions": questions}  # no plan text kept
            for asker_agent, asker_request_id in askers:  # a coalesced card's other askers: their history shows it too
                if asker_request_id and asker_request_id != request_id:
                    self._shown[asker_request_id] = {"agent": asker_agent, "questions": questions}
            while len(self._shown) > _SETTLED_MEMORY:
                self._shown.popitem(last=False)
            removed = {"type": "removed", "id": request_id, "reason": reason, "by": by, "settled": settled}
            self._publish({**removed, "namespace": self.broker.namespace})
        self._routes.pop(request_id, None)
        escalation = self._escalations.pop(request_id, None)
        if escalation is not None and escalation is not asyncio.current_task():
            escalation.cancel()

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
                advertising = tasks.create_task(self._advertise(), name="qb-web-advertise")
                probing = tasks.create_task(self._probe_redis(), name="qb-web-probe-redis")
                following = tasks.create_task(self._follow_holder(), name="qb-web-follow-holder")
                try:
                    await self._serve_forever()
                finally:
                    advertising.cancel()
                    probing.cancel()
                    following.cancel()
        finally:
            self._set_status("stopped")
            self._publish(None)

    async def _serve_forever(self) -> None:
        while True:
            try:
                await self._serve_once()
            except* UserQuestionError as group:
                log.warning("web provider %s stopped serving: %s", self.name, _first(group))
            except* _REDIS_DOWN as group:
                log.warning("web provider %s lost Redis: %s", self.name, _first(group))
                self._set_status("connecting")
                await asyncio.sleep(self._retry_delay)
            except* Exception as group:  # a bug must not leave the namespace unserved
                log.error("web provider %s failed; standing by again", self.name, exc_info=group)
                self._set_status("connecting")
                await asyncio.sleep(self._retry_delay)

    async def redis_run(self) -> str | None:
        """Which run of this server's Redis answers (a digest of its ``run_id``, new at every start), read at most
        once a second; None when it does not answer. A page whose session vanished compares it with the one it saw
        signing in: a Redis that restarted since, and kept no session, lost its data (it started empty)."""
        now = asyncio.get_running_loop().time()
        read_at, run = self._redis_run
        if now - read_at >= _PROBE_EVERY_S:
            try:
                async with asyncio.timeout(_RUN_TIMEOUT_S):  # /healthz waits for it, at most once a second
                    info = await self.broker.commands.call("INFO", "server")
                run = hashlib.sha256(str(info["run_id"]).encode()).hexdigest()[:16]
            except (*_REDIS_DOWN, RedisError, UserQuestionError, TimeoutError, KeyError, TypeError):
                run = None  # down, or a Redis user without INFO (the page then says only that the session ended)
            self._redis_run = (now, run)
        return run

    async def _probe_redis(self) -> None:
        """Ask Redis something every second; pages are told at once when it stops or starts answering."""
        while True:
            try:
                async with asyncio.timeout(_PROBE_TIMEOUT_S):
                    # A read of one of the namespace's own keys (it creates nothing): on a Cluster,
                    # that asks the master holding the namespace's slot, which is the one that matters.
                    await self.broker.commands.call("EXISTS", self.keys.public_url(self.name))
                ok = True
            except (*_REDIS_DOWN, UserQuestionError, TimeoutError):
                ok = False
            if ok != self.redis_ok:
                log.warning("web provider %s: Redis %s", self.name, "answers again" if ok else "does not answer")
                self.redis_ok = ok
                self._publish(self.status_event())
            await asyncio.sleep(_PROBE_EVERY_S)

    async def _follow_holder(self) -> None:
        """While standing by, list the holder's pending requests read-only (read every second).

        A standby is not in the consumer group's reading: it reads the stream's outstanding entries
        and each one's request hash, and shows those still pending. Nothing is written.
        """
        while True:
            listed: list[dict[str, Any]] = []
            self._check_takeover()
            if self.status == "standby":
                try:
                    listed = await self._read_holders_requests()
                except (*_REDIS_DOWN, UserQuestionError) as error:
                    log.debug("cannot list the holder's requests: %s", error)
                    listed = self._readonly
            if listed != self._readonly:
                self._readonly = listed
                self._publish({"type": "readonly", "namespace": self.broker.namespace, "requests": listed})
            self._holder_changed.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._holder_changed.wait(), _READONLY_EVERY_S)

    async def _read_holders_requests(self) -> list[dict[str, Any]]:
        keys, call = self.broker.keys, self.broker.commands.call
        entries = await call("XRANGE", keys.requests, "-", "+", "COUNT", _READONLY_MAX)
        asks = [(entry_id, _fields(flat)) for entry_id, flat in entries]
        asks = [(entry_id, fields) for entry_id, fields in asks if fields.get("kind") == "ask" and fields.get("rid")]
        hashes = await asyncio.gather(
            *(call("HMGET", keys.request(fields["rid"]), "state", "created", "request") for _, fields in asks)
        )
        listed: list[tuple[int, int, dict[str, Any]]] = []
        for (_, fields), (state, created, stored) in zip(asks, hashes, strict=True):
            if state != "pending":
                continue
            try:
                request = decode_request(fields.get("request") or stored or "")
            except (msgspec.DecodeError, UserQuestionError, ValueError):
                continue
            created_ms = int(created or 0)
            view = readonly_view(fields["rid"], request, created_ms)
            listed.append((PRIORITIES.index(request.priority), created_ms, view))
        listed.sort(key=lambda item: item[:2])
        return [view for _, _, view in listed]

    async def _advertise(self) -> None:
        """While active, publish this page's public URL; while standing by, learn the holder's.

        The URL key carries a TTL a few leases long, refreshed every half lease, so a
        holder that died stops being linked soon after the lease passes on.
        """
        every = max(0.2, self.broker.lease_ttl / 2)
        ttl_ms = int(self.broker.lease_ttl * 3000)
        call = self.broker.commands.call
        while True:
            self._status_changed.clear()
            try:
                if self.status == "active" and self.public_url:
                    await call("SET", self.keys.public_url(self.name), self.public_url, "PX", ttl_ms)
                elif self.status == "standby" and self.holder:
                    url = safe_url(await call("GET", self.keys.public_url(self.holder)) or "")
                    if url != self.holder_url:
                        self.holder_url = url
                        self._publish(self.status_event())
            except (*_REDIS_DOWN, UserQuestionError) as error:
                log.debug("cannot advertise the public URL: %s", error)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._status_changed.wait(), every)

    async def _serve_once(self) -> None:
        self._set_status("connecting")
        on_standby: Callable[[str], None] = lambda holder: self._set_status("standby", holder)  # noqa: E731
        try:
            async with self.broker.provider(self.name, standby=True, on_standby=on_standby) as provider:
                self._provider = provider
                provider.track_changes()  # before the first card is handed out: none of its changes is missed
                lease_acquired(self.broker.namespace)
                self._set_status("active", self.name)
                if self.policies:
                    forgotten = await revoke_covered(self.policies, self.broker, by=f"{self.name}: quorum policy")
                    if forgotten:
                        log.info("forgot %d remembered decisions a quorum policy covers", len(forgotten))
                try:
                    async with asyncio.TaskGroup() as tasks:
                        if self._lost:
                            tasks.create_task(self._resolve_lost(), name="qb-web-resolve-lost")
                        watching = tasks.create_task(self._watch(provider), name="qb-web-watch")
                        try:
                            while batch := await _ready(provider, _BATCH):
                                await self._add_batch(batch)
                        finally:
                            watching.cancel()
                finally:
                    if provider.lost:
                        lease_lost(self.broker.namespace)
                    self._provider = None
        finally:
            # Once the lease is released (leaving the block): taking 100 000 cards down took the best part of a
            # second, which a standby waited out before it could take over.
            self._take_down_all()

    def _take_down_all(self) -> None:
        for request_id in list(self._pending):
            self._lost.add(request_id)
            self._remove(request_id, "lost", "")
        while len(self._lost) > _SETTLED_MEMORY:
            self._lost.pop()

    async def _resolve_lost(self) -> None:
        """Serving again: say what became of each request lost with the lease, unless it is still pending.

        A pending one is redelivered (and shown again); one withdrawn, answered or expired meanwhile
        is announced as removed with that reason, so a page says so instead of dropping it silently.
        """
        for request_id in list(self._lost):
            try:
                state = await self.broker.commands.call("HGET", self.broker.keys.request(request_id), "state")
            except (*_REDIS_DOWN, UserQuestionError) as error:
                log.debug("cannot tell what became of %s: %s", request_id, error)
                continue
            if state == "pending" or request_id not in self._lost:
                continue
            self._lost.discard(request_id)
            settled = await self._settled_in_redis(request_id)
            reason, by = (settled.state, settled.by) if settled is not None else ("gone", "")
            removed = {"type": "removed", "id": request_id, "reason": reason, "by": by}
            self._publish(
                {**removed, "settled": settled.view() if settled else None, "namespace": self.broker.namespace}
            )

    async def _watch(self, provider: Provider) -> None:
        """Take cards down when withdrawn; say when an asker goes away or comes back (one task for every card)."""
        while True:
            changed: list[PendingRequest] = []
            for pending in await provider.changes():
                if self._pending.get(pending.request_id) is not pending:
                    continue  # not shown yet (``_add`` reads what is true when it shows it), or gone already
                if pending.is_withdrawn:
                    self._remove(pending.request_id, "withdrawn", "")
                else:
                    pending.changed.clear()
                    changed.append(pending)
            if len(changed) == 1:
                await self._asker_changed(changed[0])
            elif changed:
                await asyncio.gather(*(self._asker_changed(pending) for pending in changed))

    async def _asker_changed(self, pending: PendingRequest) -> None:
        """An asker went away or came back, joined or left the card, or raised its priority."""
        if pending.request_id not in self._views:
            return
        away_until = await self._away_until(pending)
        built = not isinstance(self._views.get(pending.request_id), _Unbuilt)
        view = self._view(pending.request_id)
        if view is None:
            return
        now = {"askerAway": pending.asker_away, "awayUntilMs": away_until, **asking_view(pending)}
        level = self._arrivals.level_of(pending.request_id)
        moved = level is not None and level != pending.level
        tags = _tags({**view, **now})  # who asks, and how urgently, may have changed: the API's filters follow
        if moved:  # an urgent asker joined (or left): the card takes its place among the cards of its new level
            self._arrivals.add(pending.request_id, pending.level, tags)
        else:
            self._arrivals.retag(pending.request_id, tags)
        # An unbuilt view is built from what is true now: the pages were shown what was true before, so they are told.
        if built and not moved and all(view.get(name) == value for name, value in now.items()):
            return
        view.update(now)
        self._publish({"type": "updated", "id": pending.request_id, **now, "namespace": self.broker.namespace})
        if moved and pending.level < (level or 0):  # a page whose window did not reach it may hold cards it now goes
            self._publish({"type": "added", "request": view})  # ahead of: sent in full there (window.py)


async def _ready(provider: Provider, most: int) -> list[PendingRequest]:
    """The next card (waited for), with up to ``most - 1`` more already waiting; empty once the provider
    ends (a hand-over). Raises ``LEASE_LOST`` only before any card is taken (the next call raises it)."""
    try:
        first = await anext(provider)
    except StopAsyncIteration:
        return []
    return [first, *provider.take_ready(most - 1)]


def _fields(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _first(error: BaseException) -> BaseException:
    """The first leaf of a (nested) exception group, for a one-line log."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
