"""What one page's change stream sends in full, and what it only counts (issue 27).

A page starts from the first ``size`` cards of each namespace it serves (the snapshot) and
fetches the rest a page at a time through ``GET /api/requests?namespace=&after=``. A card
delivered later is sent in full while the page holds fewer than ``size`` of the cards the
stream sent it, or when it goes ahead of the cards the stream sent (an urgent card behind a backlog
of normal ones: the page's cursor is past its place, so the page would never fetch it) and fewer
than ``size`` of them are ahead of it (a flood of urgent asks is not sent whole); otherwise the page
is only told the new total and where the counted cards stand (a ``waiting`` event), and fetches them
when it gets there, or from there if its cursor is already past. With 100 000 pending, a page
neither receives nor renders them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["PageWindow"]

Event = dict[str, Any]


class PageWindow:
    """Per page: the ids of the cards its stream sent in full and that are still pending (with their places), by
    namespace."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._sent: dict[str, dict[str, int]] = {}
        self._reach: dict[str, int] = {}
        """by namespace: the place (``Arrivals`` sequence) of the furthest card sent in full"""

    def pass_on(self, event: Event, total: int, seq_of: Callable[[str], int | None] = lambda _: None) -> Event:
        """The event as this page gets it; ``total``: how many cards of its namespace it may see now;
        ``seq_of``: a pending card's place in the order shown (its namespace's ``WebProvider.seq_of``).

        Call it with the events the page may see (after routing), in order."""
        kind = event["type"]
        if kind == "snapshot":
            self._sent[event["namespace"]] = {view["id"]: seq_of(view["id"]) or 0 for view in event["requests"]}
            self._reach[event["namespace"]] = event.get("after", 0)
            snapshot = {name: value for name, value in event.items() if name != "after"}
            return {**snapshot, "total": total, "cursor": f"0.{event.get('after', 0)}"}
        if kind == "removed":
            self._sent.get(event["namespace"], {}).pop(event["id"], None)
            return {**event, "total": total}
        if kind not in ("added", "addedMany"):
            return event
        views = [event["request"]] if kind == "added" else event["requests"]
        namespace = event.get("namespace") or views[0]["namespace"]
        sent = self._sent.setdefault(namespace, {})
        reach = self._reach.get(namespace, 0)
        room = []
        beyond: list[int] = []
        for view in views:
            seq = seq_of(view["id"])
            if view["id"] not in sent and len(sent) >= self.size and not self._ahead(sent, seq, reach):
                beyond += [] if seq is None else [seq]
                continue  # beyond the window: counted in ``total``, fetched by the page when it gets there
            sent[view["id"]] = seq or 0
            reach = max(reach, seq or 0)
            room.append(view)
        self._reach[namespace] = reach
        # ``at``: where the first card only counted stands, and ``counted``: how many (they follow one another: the
        # newest of their level). A page whose cursor is past ``at`` (it fetched on from the API: a normal card asked
        # while it holds low ones, or more urgent ones than a window's worth) fetches them there, else it never would.
        counted = {"at": min(beyond), "counted": len(beyond)} if beyond else {}
        if not room:
            return {"type": "waiting", "namespace": namespace, "total": total, **counted}
        if kind == "added":
            return {**event, "namespace": namespace, "total": total}
        return {**event, "requests": room, "total": total, **counted}

    def _ahead(self, sent: dict[str, int], seq: int | None, reach: int) -> bool:
        """Whether a card goes ahead of the cards sent (its place is before the furthest), and among the first
        ``size`` of them: a flood of urgent asks sends a window's worth in full, and counts the rest."""
        return seq is not None and seq < reach and sum(1 for place in sent.values() if place < seq) < self.size
