"""The web server's order of shown requests, paged by a cursor (workers/answering/web/paging.py)."""

from __future__ import annotations

from workers.answering.web.paging import Arrivals


def ids(arrivals: Arrivals, after: int = 0) -> list[str]:
    return [request_id for _, request_id in arrivals.after(after)]


def test_a_page_after_a_cursor_skips_removed_ids_and_moves_a_re_added_one_to_the_end() -> None:
    arrivals = Arrivals()
    for request_id in "abcde":
        arrivals.add(request_id)
    arrivals.remove("b")
    arrivals.add("a")  # shown again (redelivered after a lost lease)
    assert ids(arrivals) == ["c", "d", "e", "a"] and len(arrivals) == 4
    cursor = dict((rid, seq) for seq, rid in arrivals.after(0))["d"]
    assert ids(arrivals, cursor) == ["e", "a"]


def test_compaction_keeps_the_order_and_the_cursors() -> None:
    arrivals = Arrivals()
    for n in range(5000):
        arrivals.add(str(n))
    cursor = dict((rid, seq) for seq, rid in arrivals.after(0))["4000"]
    for n in range(0, 4990):
        if n != 4000:
            arrivals.remove(str(n))
    assert len(arrivals._ids) < 2 * len(arrivals) + 1024 + 1  # rebuilt, not grown
    assert ids(arrivals) == ["4000", *map(str, range(4990, 5000))]
    assert ids(arrivals, cursor) == [str(n) for n in range(4990, 5000)]
