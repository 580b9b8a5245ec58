"""The pending requests a web server shows, in the order it shows them, paged by a cursor (issue 27).

Urgent first, then normal, then low (the providers' levels, ``broker/_schedule.py``); within a level,
in the order the provider handed them out (its per-agent turns). A page after a cursor costs
O(log n + the page) for n shown, however many are pending: the API lists 100 000 pending questions a
page at a time rather than all of them in one reply, and an urgent one asked behind them is on the first.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import islice

from broker.types import PRIORITIES

__all__ = ["Arrivals"]

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
    """Request ids by level, then arrival; a removed id is skipped, a re-added one moves to the end of its level."""

    def __init__(self) -> None:
        self._lines = [_Line() for _ in PRIORITIES]
        self._seq_of: dict[str, int] = {}
        self._next = 1

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

    def add(self, request_id: str, level: int = 1) -> None:
        """Shown (again, or at another level: an urgent asker joined the card): last of its level."""
        self.remove(request_id)
        seq, self._next = level << _LEVEL_SHIFT | self._next, self._next + 1
        line = self._lines[level]
        self._seq_of[request_id] = seq
        line.seqs.append(seq)
        line.ids.append(request_id)
        line.live += 1

    def remove(self, request_id: str) -> None:
        seq = self._seq_of.pop(request_id, None)
        if seq is None:
            return
        line = self._lines[seq >> _LEVEL_SHIFT]
        line.live -= 1
        if len(line.ids) > 2 * line.live + _COMPACT_OVER:
            live = [(s, rid) for s, rid in zip(line.seqs, line.ids, strict=True) if self._seq_of.get(rid) == s]
            line.seqs, line.ids = [s for s, _ in live], [rid for _, rid in live]

    def after(self, cursor: int) -> Iterator[tuple[int, str]]:
        """(sequence, request id) of each live id shown after ``cursor`` (0: from the first), in order.

        Consume it before anything else changes the index (no await in between)."""
        for line in self._lines[min(cursor >> _LEVEL_SHIFT, len(self._lines)) :]:
            start = bisect_right(line.seqs, cursor)
            for seq, request_id in zip(islice(line.seqs, start, None), islice(line.ids, start, None), strict=True):
                if self._seq_of.get(request_id) == seq:
                    yield seq, request_id
