"""The pending requests a web server shows, in the order it showed them, paged by a cursor (issue 27).

A page after a cursor costs O(log n + the page) for n shown, however many are pending: the API
lists 100 000 pending questions a page at a time rather than all of them in one reply.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from itertools import islice

__all__ = ["Arrivals"]

_COMPACT_OVER = 1024
"""removed entries kept at most (beyond as many as are live) before the index is rebuilt"""


class Arrivals:
    """Request ids with increasing sequence numbers; a removed id is skipped, a re-added one moves to the end."""

    def __init__(self) -> None:
        self._seqs: list[int] = []
        self._ids: list[str] = []
        self._seq_of: dict[str, int] = {}
        self._next = 1

    def __len__(self) -> int:
        return len(self._seq_of)

    def seq_of(self, request_id: str) -> int | None:
        """The sequence of a live id: a cursor that pages on after it."""
        return self._seq_of.get(request_id)

    def add(self, request_id: str) -> None:
        seq, self._next = self._next, self._next + 1
        self._seq_of[request_id] = seq
        self._seqs.append(seq)
        self._ids.append(request_id)

    def remove(self, request_id: str) -> None:
        if self._seq_of.pop(request_id, None) is not None and len(self._ids) > 2 * len(self._seq_of) + _COMPACT_OVER:
            live = [(seq, rid) for seq, rid in zip(self._seqs, self._ids, strict=True) if self._seq_of.get(rid) == seq]
            self._seqs, self._ids = [seq for seq, _ in live], [rid for _, rid in live]

    def after(self, cursor: int) -> Iterator[tuple[int, str]]:
        """(sequence, request id) of each live id shown after ``cursor`` (0: from the first), in order.

        Consume it before anything else changes the index (no await in between)."""
        start = bisect_right(self._seqs, cursor)
        for seq, request_id in zip(islice(self._seqs, start, None), islice(self._ids, start, None), strict=True):
            if self._seq_of.get(request_id) == seq:
                yield seq, request_id
