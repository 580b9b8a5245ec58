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
    assert arrivals.held() < 2 * len(arrivals) + 1024 + 1  # rebuilt, not grown
    assert ids(arrivals) == ["4000", *map(str, range(4990, 5000))]
    assert ids(arrivals, cursor) == [str(n) for n in range(4990, 5000)]


def test_a_more_urgent_card_pages_first_and_after_the_cursors_of_those_it_passed() -> None:
    """Urgent, normal, low (levels 0, 1, 2); within a level in the order shown. A card that arrives later at a more
    urgent level sorts before the cursors of the cards it passed: a page that holds them is sent it in full."""
    arrivals = Arrivals()
    for request_id in "abc":
        arrivals.add(request_id, 1)
    arrivals.add("low", 2)
    cursor_b = arrivals.seq_of("b")
    assert cursor_b is not None
    arrivals.add("urgent", 0)
    arrivals.add("d", 1)
    assert ids(arrivals) == ["urgent", "a", "b", "c", "d", "low"]
    assert ids(arrivals, cursor_b) == ["c", "d", "low"]
    urgent = arrivals.seq_of("urgent")
    assert urgent is not None and urgent < cursor_b
    arrivals.add("c", 0)  # an urgent asker joined it: it moves to the end of the urgent ones
    assert ids(arrivals) == ["urgent", "c", "a", "b", "d", "low"] and len(arrivals) == 6
    arrivals.remove("urgent")
    assert ids(arrivals, urgent) == ["c", "a", "b", "d", "low"]


def tagged(arrivals: Arrivals, tag: object, after: int = 0) -> list[str]:
    return [request_id for _, request_id in arrivals.after(after, tag)]


def test_a_tags_line_lists_its_live_ids_in_the_order_shown_and_follows_every_change() -> None:
    """A filtered page walks a tag's line (issue: a page for one agent of 1 000 walked all 100 000 pending): the
    line never lists an id removed or no longer tagged, never misses one tagged, and keeps the order shown."""
    arrivals = Arrivals()
    for request_id in "abcde":
        arrivals.add(request_id, 1, [("agent", "x" if request_id in "ace" else "y")])
    arrivals.add("u", 0, [("agent", "x")])
    assert tagged(arrivals, ("agent", "x")) == ["u", "a", "c", "e"]
    assert tagged(arrivals, ("agent", "y")) == ["b", "d"]
    assert tagged(arrivals, ("agent", "nobody")) == []
    arrivals.remove("c")  # settled
    assert tagged(arrivals, ("agent", "x")) == ["u", "a", "e"]
    arrivals.retag("b", [("agent", "y"), ("agent", "x")])  # x joined b's card: at b's place on x's line
    assert tagged(arrivals, ("agent", "x")) == ["u", "a", "b", "e"]
    arrivals.retag("a", [("agent", "y")])  # x left a's card
    assert tagged(arrivals, ("agent", "x")) == ["u", "b", "e"]
    assert tagged(arrivals, ("agent", "y")) == ["a", "b", "d"]
    arrivals.retag("a", [("agent", "x")])  # and came back: once, at its place
    assert tagged(arrivals, ("agent", "x")) == ["u", "a", "b", "e"]
    arrivals.add("d", 0, [("agent", "x")])  # an urgent asker joined d's card: it moves, with its new tags
    assert tagged(arrivals, ("agent", "x")) == ["u", "d", "a", "b", "e"]
    assert tagged(arrivals, ("agent", "y")) == ["b"]
    cursor = arrivals.seq_of("a")
    assert cursor is not None
    assert tagged(arrivals, ("agent", "x"), cursor) == ["b", "e"]
    assert [rid for _, rid in arrivals.after(0) if ("agent", "x") in arrivals.tags_of(rid)] == tagged(
        arrivals, ("agent", "x")
    )
    arrivals.add("e", 0, [("agent", "x")])  # raised with the same asker: listed once, at its new place
    assert tagged(arrivals, ("agent", "x")) == ["u", "d", "e", "a", "b"]
    arrivals.retag("gone", [("agent", "x")])  # not shown: nothing filed
    assert "gone" not in tagged(arrivals, ("agent", "x"))


def test_a_tags_line_is_compacted_and_dropped_with_its_last_id() -> None:
    arrivals = Arrivals()
    for n in range(5000):
        arrivals.add(str(n), 1, [("agent", "many"), ("agent", f"one-{n}")])
    cursor = arrivals.seq_of("4000")
    for n in range(4990):
        if n != 4000:
            arrivals.remove(str(n))
    assert arrivals.filed(("agent", "many")) < 2 * len(arrivals) + 1024 + 1  # rebuilt, not grown
    assert tagged(arrivals, ("agent", "many")) == ["4000", *map(str, range(4990, 5000))]
    assert cursor is not None and tagged(arrivals, ("agent", "many"), cursor) == [str(n) for n in range(4990, 5000)]
    assert arrivals.filed(("agent", "one-7")) == 0  # an agent gone leaves no line behind
    for n in range(4990, 5000):
        arrivals.retag(str(n), [("agent", "many")])
    assert arrivals.filed(("agent", "one-4995")) == 0
    assert tagged(arrivals, ("agent", "many")) == ["4000", *map(str, range(4990, 5000))]
