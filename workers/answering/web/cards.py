"""The cards a web provider shows: each pending request's view, their order, who may see them, and
what is remembered of the cards gone (for the history, and to tell a late click who was first).

``Cards`` holds no connection: it is told what was delivered, voted, settled or taken down, and
tells the pages (``publish``). Views are built when something asks for one (``Unbuilt``).
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

import msgspec

from broker import AskUserQuestionRequest, PendingRequest, Policies, Tally
from workers.answering.web.paging import Arrivals, Tag
from workers.answering.web.render import asking_view, plan_review, request_view, shown_agent
from workers.answering.web.settled import Settled
from workers.inert import inert

__all__ = ["SETTLED_MEMORY", "Cards", "Event", "Later", "Unbuilt", "card_tags", "filter_tags", "pending_tags"]

Event = dict[str, Any]

SETTLED_MEMORY = 2_000
"""cards gone that are remembered (how each was settled; what each asked), and lost ones followed up"""


def filter_tags(*, agent: str | None = None, priority: str | None = None, intent: str | None = None) -> list[Tag]:
    """The tags every card an API filter keeps is filed under (``card_tags``): its page walks the shortest line."""
    return [
        *([("agent", agent)] if agent is not None else []),
        *([("priority", priority)] if priority is not None else []),
        *([("intent", intent)] if intent is not None else []),
    ]


def card_tags(view: dict[str, Any]) -> frozenset[Tag]:
    """What the API's filters read of a card's view (``app._requests_page``): each agent that asks it (the card's
    and its coalesced askers'), its priority, each kind of its questions."""
    agents = (view["agent"], *(asker["agent"] for asker in view["askers"]))
    kinds = tuple("plan-review" if question.get("planReview") else "none" for question in view["questions"])
    return _tagset(agents, view["priority"], kinds)


def pending_tags(pending: PendingRequest) -> frozenset[Tag]:
    """``card_tags`` of the view ``pending`` is shown with, read off the card: a failover's unbuilt cards build
    no view, nor the parts of one that filters read (``filtered``)."""
    questions = pending.request.questions
    agents = (shown_agent(pending.agent_id), *(shown_agent(asker.agent_id) for asker in pending.askers))
    kinds = tuple("none" if plan_review(item, len(questions)) is None else "plan-review" for item in questions)
    return _tagset(agents, pending.priority, kinds)


@functools.lru_cache(maxsize=4096)
def _tagset(agents: tuple[str | None, ...], priority: str, kinds: tuple[str, ...]) -> frozenset[Tag]:
    """One set shared by the cards of the same tags (an agent's many cards): 100 000 cards hold no set each."""
    return frozenset((*(("agent", agent) for agent in agents), ("priority", priority), *(("intent", k) for k in kinds)))


class Unbuilt:
    """A card shown here whose view is built when something asks for it: 100 000 pending cards hold no
    view each (about 1 KB a card), only this marker, one shared by every card of the same owner. Only a
    card whose view nothing changes after it is shown (no quorum policy, no asker away) is left unbuilt;
    its view is what it would have been when shown, built from the delivered request."""

    __slots__ = ("owner",)

    def __init__(self, owner: str | None) -> None:
        self.owner = owner


class Later(dict[str, Any]):
    """An unbuilt card in an ``addedMany`` event, its id and namespace: its view is built for a page that is sent it
    (``Cards.built``), not for every card of a failover's batch when a page's window keeps the first 100 of them."""

    __slots__ = ()


class Cards:
    """The pending cards of one namespace as its pages see them, and the memory of those gone."""

    def __init__(self, namespace: str, policies: Policies, publish: Callable[[Event | None], None]) -> None:
        self.namespace = namespace
        self.policies = policies
        self._publish = publish
        self.pending: dict[str, PendingRequest] = {}
        self.views: dict[str, dict[str, Any] | Unbuilt] = {}
        """request id -> what pages are shown of it (built when first asked for: ``view``)"""
        self._unbuilt: dict[str | None, Unbuilt] = {}
        """owner -> the marker its cards share while their views are not built"""
        self.arrivals = Arrivals()
        """the ids of ``views`` in the order shown (urgent first), for the API's pages and the pages' windows"""
        self.routes: dict[str, list[str]] = {}
        """request id -> the groups its card is routed to (the escalation group joins later), while it is shown"""
        self.escalations: dict[str, asyncio.Task[None]] = {}
        """request id -> the timer that widens who may answer its card (a policy's ``escalate``)"""
        self.locks: dict[str, asyncio.Lock] = {}
        """request id -> held while someone settles it here (``WebProvider.answer``)"""
        self.settled: OrderedDict[str, Settled] = OrderedDict()
        self.shown: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """request id -> who asked what, of a card gone (no plan text kept), for the history"""
        self.lost: set[str] = set()
        """requests taken down when the lease was lost: each comes back (redelivered) or is said to be gone"""

    # -- what pages see ---------------------------------------------------------------

    def publish(self, event: Event | None) -> None:
        """Tell the pages; an event about a routed card says where it is routed (``may_see`` reads it), one about
        a card gone (a lost card's follow-up: how it was settled) where it was routed while shown."""
        routes = None
        if event is not None and "id" in event:
            routes = self.routes.get(event["id"]) or (self.shown.get(event["id"]) or {}).get("routes")
        if event is not None and routes:
            event = {**event, "route": routes[0], "routes": routes}
        self._publish(event)

    def view(self, request_id: str, *, keep: bool = True) -> dict[str, Any] | None:
        """What pages are shown of a pending card; ``keep``: an unbuilt view is kept once built (to change it)."""
        view = self.views.get(request_id)
        if not isinstance(view, Unbuilt):
            return view
        built = self.build_view(self.pending[request_id], view.owner)
        if keep:
            self.views[request_id] = built
        return built

    def built(self, views: list[Event]) -> list[Event]:
        """``views`` (an ``addedMany`` event's) with each ``Later`` built, those no longer pending left out."""
        if not any(isinstance(view, Later) for view in views):
            return views
        built = (self.view(view["id"], keep=False) if isinstance(view, Later) else view for view in views)
        return [view for view in built if view is not None]

    def filtered(self, pending: PendingRequest) -> dict[str, Any]:
        """The fields of a card's view that page filters read (the API's agent, priority and intent, routing):
        who asks, how urgently, which questions are plan reviews. An unbuilt card has no route (a routed card's
        view is kept built)."""
        questions = pending.request.questions
        return {
            "id": pending.request_id,
            "agent": shown_agent(pending.agent_id),  # as the built view shows it
            **asking_view(pending),
            "questions": [{"planReview": plan_review(item, len(questions))} for item in questions],
        }

    def build_view(self, pending: PendingRequest, owner: str | None) -> dict[str, Any]:
        view = request_view(pending)
        view.update(deadlineMs=pending.deadline_ms, owner=owner, namespace=self.namespace, awayUntilMs=None)
        return view

    def requests(self) -> list[dict[str, Any]]:
        """Every pending card's view, in the order shown: urgent first, as ``page`` lists them."""
        ids = [request_id for _, request_id in self.arrivals.after(0)]
        return [view for request_id in ids if (view := self.view(request_id, keep=False)) is not None]

    def page(
        self, after: int, limit: int, wanted: Callable[[dict[str, Any]], bool], among: Collection[Tag] = ()
    ) -> tuple[list[Event], int | None]:
        """Up to ``limit`` views shown after the cursor ``after`` that are ``wanted``, in the order shown,
        and the cursor of the next page (None: this was the last). ``among``: tags every wanted card is filed
        under (``filter_tags``): only the cards of the shortest of their lines are judged, not every pending one."""
        views: list[Event] = []
        last = after
        tag = min(among, key=self.arrivals.filed) if among else None
        for seq, request_id in self.arrivals.after(after, tag):
            view = self.views.get(request_id)
            if isinstance(view, Unbuilt):
                # Judged first on what filters read: a view is built only for a card that is wanted, so a
                # filter matching a few of 100 000 cards does not build a view for every card it passes.
                if not wanted(self.filtered(self.pending[request_id])):
                    continue
                view = self.view(request_id, keep=False)
            if view is None or not wanted(view):
                continue
            if len(views) == limit:
                return views, last
            views.append(view)
            last = seq
        return views, None

    def visible_count(self, user: str) -> int:
        """How many cards are pending here that ``user`` may see: O(cards routed to a group)."""
        hidden = sum(1 for routes in self.routes.values() if not self.may_see({"routes": routes}, user))
        return len(self.views) - hidden

    def may_see(self, event: Event, user: str) -> bool:
        """Routing: an event about a card routed to a group goes to its members only (and, once the card
        escalated, to the escalation group's)."""
        request = event.get("request") or {}
        routes = event.get("routes") or request.get("routes")
        if not routes:
            route = event.get("route") or request.get("route")
            routes = [route] if route else []
        return not routes or any(user in self.policies.groups.get(group, frozenset()) for group in routes)

    def sees_every_card(self, user: str) -> bool:
        """Whether ``user`` is in the group of every policy that routes, so may see any card (a history entry
        whose route is not known, say); with no routing policy, everyone may."""
        return all(self.may_see({"route": policy.route}, user) for policy in self.policies.policies if policy.route)

    def routes_for(self, request: AskUserQuestionRequest, created_ms: int) -> list[str]:
        """The groups a card of ``request`` alone, asked at ``created_ms``, is routed to now, by the policies the
        live cards are routed by: how a standby routes the holder's cards it lists read-only (``may_see``)."""
        policy = self.policies.for_request(request, request.priority, [request.agent])
        if policy is None:
            return []
        return list(self.policies.routed_to(policy, policy.escalated_since(created_ms)))

    def knows(self, request_id: str) -> bool:
        """Whether the request is pending here or was settled here lately."""
        return request_id in self.pending or request_id in self.settled

    def recalled(self, request_id: str) -> dict[str, Any] | None:
        """The view of a request this server showed (pending or recently gone), for the history."""
        return self.view(request_id, keep=False) or self.shown.get(request_id)

    # -- what changes them ------------------------------------------------------------

    def show(self, pending: PendingRequest, view: dict[str, Any] | None, *, owner: str | None) -> Event:
        """The card is shown from now on, with ``view`` kept (something may change it), or, without one, its view
        built whenever asked for; what an event tells pages of it (``view``, or a ``Later`` for ``built``)."""
        request_id = pending.request_id
        self.lost.discard(request_id)
        self.pending[request_id] = pending
        if view is not None:
            self.views[request_id] = view
        else:
            self.views[request_id] = self._unbuilt.setdefault(owner, Unbuilt(owner))
        self.arrivals.add(request_id, pending.level, card_tags(view) if view is not None else pending_tags(pending))
        return view if view is not None else Later(id=request_id, namespace=self.namespace)

    def tallied(self, pending: PendingRequest, tally: Tally) -> None:
        """Show the votes so far, or settle the card here once they decide it."""
        request_id = pending.request_id
        decided = tally.decided
        if decided is None:
            view = self.view(request_id)
            if view is not None:
                view["quorum"] = tally.view()
                now = {
                    "askerAway": pending.asker_away,
                    "awayUntilMs": view.get("awayUntilMs"),
                    **asking_view(pending),
                    "quorum": view["quorum"],
                }
                self.publish({"type": "updated", "id": request_id, **now, "namespace": self.namespace})
        elif decided.answer is None:
            self.settle(request_id, "cancelled", ", ".join(tally.by))
        else:
            self.settle(request_id, "answered", ", ".join(tally.by), msgspec.to_builtins(decided.answer))

    def settle(self, request_id: str, state: str, by: str, answer: Any = None) -> None:
        settled = Settled(state, by, answer)
        self.settled[request_id] = settled
        while len(self.settled) > SETTLED_MEMORY:
            self.settled.popitem(last=False)
        self.remove(request_id, state, by, settled.view())

    def take_down_all(self) -> None:
        """The lease is lost: every card goes, and is followed up when this server serves again."""
        for request_id in list(self.pending):
            self.lost.add(request_id)
            self.remove(request_id, "lost", "")
        while len(self.lost) > SETTLED_MEMORY:
            self.lost.pop()

    def remove(self, request_id: str, reason: str, by: str, settled: Event | None = None) -> None:
        pending = self.pending.pop(request_id, None)
        self.locks.pop(request_id, None)
        view = self.views.pop(request_id, None)
        self.arrivals.remove(request_id)
        if view is not None:
            agent, questions, askers = _asked(view, pending)
            # no plan text kept; its routes (none: routed to nobody), for a history entry that records none
            routes = self.routes.get(request_id)
            self.shown[request_id] = {"agent": agent, "questions": questions, "routes": routes}
            for asker_agent, asker_request_id in askers:  # a coalesced card's other askers: their history shows it too
                if asker_request_id and asker_request_id != request_id:
                    self.shown[asker_request_id] = {"agent": asker_agent, "questions": questions, "routes": routes}
            while len(self.shown) > SETTLED_MEMORY:
                self.shown.popitem(last=False)
            removed = {"type": "removed", "id": request_id, "reason": reason, "by": by, "settled": settled}
            self.publish({**removed, "namespace": self.namespace})
        self.routes.pop(request_id, None)
        escalation = self.escalations.pop(request_id, None)
        if escalation is not None and escalation is not asyncio.current_task():
            escalation.cancel()


def _asked(
    view: dict[str, Any] | Unbuilt, pending: PendingRequest | None
) -> tuple[Any, list[dict[str, Any]], list[tuple[Any, Any]]]:
    """Who asked a card gone, what (each question and a plan's approve label), and its coalesced askers."""
    if isinstance(view, Unbuilt):  # read off the card: a lost lease takes 100 000 down, no view built each
        assert pending is not None  # an unbuilt view is a pending card's
        count = len(pending.request.questions)
        questions = [
            {
                "id": item.id,
                "question": inert(item.question),
                "approve": (plan_review(item, count) or {}).get("approve"),
            }
            for item in pending.request.questions
        ]
        return pending.agent_id, questions, [(asker.agent_id, asker.request_id) for asker in pending.askers]
    questions = [
        {"id": q["id"], "question": q["question"], "approve": (q.get("planReview") or {}).get("approve")}
        for q in view["questions"]
    ]
    return view["agent"], questions, [(asker.get("agent"), asker.get("requestId")) for asker in view.get("askers", ())]
