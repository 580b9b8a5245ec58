"""The pending requests a web server shows, in the order it shows them, paged by a cursor (issue 27).

Urgent first, then normal, then low (the providers' levels, ``broker/answering/_schedule.py``); within a level,
in the order the provider handed them out (its per-agent turns). A page after a cursor costs
O(log n + the page) for n shown, however many are pending: the API lists 100 000 pending questions a
page at a time rather than all of them in one reply, and an urgent one asked behind them is on the first.

Each id is also filed under its tags (who asks, how urgently, which kinds of question: what the API's filters
read), one line per tag in the same order: a page filtered by one agent of 1 000 walks that agent's cards, not
every pending card (570 ms at 100 000 pending before).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Hashable, Iterator
from itertools import islice

from broker.types import PRIORITIES

__all__ = ["Arrivals", "Tag"]

Tag = Hashable
"""what a filter matches, e.g. ``("agent", "builder")``: an id filed under it is on that tag's line"""

_COMPACT_OVER = 1024
"""removed entries kept at most in a level (beyond as many as are live) before its index is rebuilt"""
_LEVEL_SHIFT = 48
"""a sequence is ``level << _LEVEL_SHIFT | arrival``: every urgent card's sorts before every normal one's"""


class _Line:
    """One level's ids in arrival order: sequences only grow, so adding is an append."""

    __slots__ = ("ids", "live", "seqs")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.ids: list[str] = []
        self.live = 0


class Arrivals:
    """Request ids by level, then arrival; a removed id is skipped, a re-added one moves to the end of its level.
    The same per tag: an id retagged (an asker joined its card) is filed at its place on the new tag's line."""

    def __init__(self) -> None:
        self._lines = [_Line() for _ in PRIORITIES]
        self._seq_of: dict[str, int] = {}
        self._next = 1
        self._tagged: dict[tuple[Tag, int], _Line] = {}
        """(tag, level) -> the ids of that level filed under the tag, in the order shown"""
        self._tags_of: dict[str, frozenset[Tag]] = {}

    def __len__(self) -> int:
        return len(self._seq_of)

    def held(self) -> int:
        """Entries kept, removed ones not yet compacted away included."""
        return sum(len(line.ids) for line in self._lines)

    def seq_of(self, request_id: str) -> int | None:
        """The sequence of a live id: a cursor that pages on after it."""
        return self._seq_of.get(request_id)

    def level_of(self, request_id: str) -> int | None:
        """The level a live id is filed at."""
        seq = self._seq_of.get(request_id)
        return None if seq is None else seq >> _LEVEL_SHIFT

    def tags_of(self, request_id: str) -> frozenset[Tag]:
        return self._tags_of.get(request_id, frozenset())

    def add(self, request_id: str, level: int = 1, tags: Collection[Tag] = ()) -> None:
        """Shown (again, or at another level: an urgent asker joined the card): last of its level."""
        self.remove(request_id)
        seq, self._next = level << _LEVEL_SHIFT | self._next, self._next + 1
        self._seq_of[request_id] = seq
        line = self._lines[level]
        line.seqs.append(seq)  # the newest sequence of its level: last on each of its lines
        line.ids.append(request_id)
        line.live += 1
        tagged = self._tags_of[request_id] = frozenset(tags)
        for tag in tagged:  # a failover files 100 000 cards at once: no more than an append per line
            line = self._tagged.get((tag, level)) or self._tagged.setdefault((tag, level), _Line())
            line.seqs.append(seq)
            line.ids.append(request_id)
            line.live += 1

    def retag(self, request_id: str, tags: Collection[Tag]) -> None:
        """A live id's tags changed (who asks changed) while its place did not."""
        seq = self._seq_of.get(request_id)
        if seq is None:
            return
        level, old, new = seq >> _LEVEL_SHIFT, self._tags_of[request_id], frozenset(tags)
        self._tags_of[request_id] = new
        for tag in old - new:
            self._untag(tag, level)
        for tag in new - old:
            tagged = self._tagged.setdefault((tag, level), _Line())
            tagged.live += 1
            at = bisect_left(tagged.seqs, seq)
            if at < len(tagged.seqs) and tagged.seqs[at] == seq:
                continue  # filed there before it lost the tag, and not compacted away since: the entry counts again
            tagged.seqs.insert(at, seq)
            tagged.ids.insert(at, request_id)

    def remove(self, request_id: str) -> None:
        seq = self._seq_of.pop(request_id, None)
        if seq is None:
            return
        level = seq >> _LEVEL_SHIFT
        line = self._lines[level]
        line.live -= 1
        if len(line.ids) > 2 * line.live + _COMPACT_OVER:
            live = [(s, rid) for s, rid in zip(line.seqs, line.ids, strict=True) if self._seq_of.get(rid) == s]
            line.seqs, line.ids = [s for s, _ in live], [rid for _, rid in live]
        for tag in self._tags_of.pop(request_id):
            self._untag(tag, level)

    def _untag(self, tag: Tag, level: int) -> None:
        tagged = self._tagged[tag, level]
        tagged.live -= 1
        if not tagged.live:  # an agent gone for good leaves no line behind (a fleet's agents come and go)
            del self._tagged[tag, level]
        elif len(tagged.ids) > 2 * tagged.live + _COMPACT_OVER:
            live = [(s, rid) for s, rid in zip(tagged.seqs, tagged.ids, strict=True) if self._counts(rid, s, tag)]
            tagged.seqs, tagged.ids = [s for s, _ in live], [rid for _, rid in live]

    def _counts(self, request_id: str, seq: int, tag: Tag) -> bool:
        return self._seq_of.get(request_id) == seq and tag in self._tags_of[request_id]

    def filed(self, tag: Tag) -> int:
        """Entries filed under a tag (removed ones not yet compacted away included): what walking it costs."""
        return sum(len(line.ids) for level in range(len(PRIORITIES)) if (line := self._tagged.get((tag, level))))

    def after(self, cursor: int, tag: Tag | None = None) -> Iterator[tuple[int, str]]:
        """(sequence, request id) of each live id shown after ``cursor`` (0: from the first), in order;
        with ``tag``, only the ids filed under it.

        Consume it before anything else changes the index (no await in between)."""
        first = min(cursor >> _LEVEL_SHIFT, len(self._lines))
        if tag is not None:
            for level in range(first, len(self._lines)):
                tagged = self._tagged.get((tag, level))
                if tagged is None:
                    continue
                start = bisect_right(tagged.seqs, cursor)
                for seq, request_id in zip(
                    islice(tagged.seqs, start, None), islice(tagged.ids, start, None), strict=True
                ):
                    if self._counts(request_id, seq, tag):
                        yield seq, request_id
            return
        for line in self._lines[first:]:
            start = bisect_right(line.seqs, cursor)
            for seq, request_id in zip(islice(line.seqs, start, None), islice(line.ids, start, None), strict=True):
                if self._seq_of.get(request_id) == seq:
                    yield seq, request_id
