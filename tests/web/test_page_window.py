"""A page's window (workers/answering/web/window.py) and the windowed snapshot it starts from (issue 27)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker import AskUserQuestionItem, AskUserQuestionRequest, load_policies
from tests.helpers import options
from tests.web.served import web_service
from workers.answering.web.service import Event
from workers.answering.web.window import PageWindow

NS = "ns"


def view(request_id: str) -> Event:
    return {"id": request_id, "namespace": NS}


def added(request_id: str) -> Event:
    return {"type": "added", "request": view(request_id)}


def test_a_card_is_sent_while_the_window_has_room_and_counted_once_it_is_full() -> None:
    window = PageWindow(2)
    snapshot = window.pass_on({"type": "snapshot", "namespace": NS, "requests": [view("a")], "after": 7}, 5)
    assert snapshot["cursor"] == "0.7" and snapshot["total"] == 5 and "after" not in snapshot
    assert window.pass_on(added("b"), 6) == {**added("b"), "namespace": NS, "total": 6}
    assert window.pass_on(added("c"), 7) == {"type": "waiting", "namespace": NS, "total": 7}
    assert window.pass_on(added("a"), 7)["type"] == "added"  # one it holds (an escalation) is brought up to date
    removed = window.pass_on({"type": "removed", "id": "a", "namespace": NS}, 6)
    assert removed["total"] == 6
    assert window.pass_on(added("d"), 7)["type"] == "added"  # room again


def test_a_batch_sends_what_fits_and_counts_the_rest() -> None:
    window = PageWindow(3)
    window.pass_on({"type": "snapshot", "namespace": NS, "requests": [view("a")], "after": 1}, 1)
    batch = {"type": "addedMany", "namespace": NS, "requests": [view(x) for x in "bcde"]}
    sent = window.pass_on(batch, 5)
    assert [v["id"] for v in sent["requests"]] == ["b", "c"] and sent["total"] == 5
    full = {"type": "addedMany", "namespace": NS, "requests": [view("f")]}
    assert window.pass_on(full, 6) == {"type": "waiting", "namespace": NS, "total": 6}


def test_a_card_ahead_of_those_the_page_holds_is_sent_in_full_though_the_window_is_full() -> None:
    """An urgent card asked behind a full window sorts before the page's cursor: the page would never fetch it
    ("N more waiting"), so the stream sends it. One that sorts after the cursor is only counted, as before."""
    window = PageWindow(2)
    seqs = {"a": 10, "b": 11, "urgent": 3, "c": 12, "low": 1 << 49}
    window.pass_on({"type": "snapshot", "namespace": NS, "requests": [view("a"), view("b")], "after": 11}, 5, seqs.get)
    assert window.pass_on(added("urgent"), 6, seqs.get) == {**added("urgent"), "namespace": NS, "total": 6}
    waiting = {"type": "waiting", "namespace": NS, "total": 7, "at": 12, "counted": 1}
    assert window.pass_on(added("c"), 7, seqs.get) == waiting
    batch = {"type": "addedMany", "namespace": NS, "requests": [view("c"), view("urgent"), view("low")]}
    sent = window.pass_on(batch, 7, seqs.get)
    assert [v["id"] for v in sent["requests"]] == ["urgent"] and (sent["at"], sent["counted"]) == (12, 2)


def test_a_flood_of_urgent_cards_sends_a_windows_worth_in_full_and_counts_the_rest() -> None:
    window = PageWindow(2)
    seqs = {"a": 10, "b": 11} | {f"u{n}": n for n in range(1, 6)}
    window.pass_on({"type": "snapshot", "namespace": NS, "requests": [view("a"), view("b")], "after": 11}, 2, seqs.get)
    assert [window.pass_on(added(f"u{n}"), 2 + n, seqs.get)["type"] for n in range(1, 4)] == [
        "added",
        "added",
        "waiting",
    ]
    window.pass_on({"type": "removed", "id": "u1", "namespace": NS}, 4)
    assert window.pass_on(added("u4"), 5, seqs.get)["type"] == "added"  # one of the first two again
    assert window.pass_on(added("u5"), 6, seqs.get) == {
        "type": "waiting",
        "namespace": NS,
        "total": 6,
        "at": 5,
        "counted": 1,
    }


def test_namespaces_have_a_window_each() -> None:
    window = PageWindow(1)
    for namespace in ("one", "two"):
        window.pass_on({"type": "snapshot", "namespace": namespace, "requests": [], "after": 0}, 0)
    first = window.pass_on({"type": "added", "request": {"id": "a", "namespace": "one"}}, 1)
    second = window.pass_on({"type": "added", "request": {"id": "b", "namespace": "two"}}, 1)
    assert first["type"] == second["type"] == "added"


def asking(text: str) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(questions=(AskUserQuestionItem(id="q", question=text, options=options("yes", "no")),))


ROUTED = """
[[policy]]
name = "billing"
match = { text = "invoice" }
route = "billing"
"""


@pytest.mark.timeout(30)
async def test_a_windowed_snapshot_holds_and_counts_only_the_cards_its_user_may_see(
    make_broker: Callable[..., Any], namespace: str, tmp_path: Path
) -> None:
    (tmp_path / "policy.toml").write_text(ROUTED)
    policies = load_policies(tmp_path / "policy.toml", groups={"billing": frozenset({"bob"})})
    asker, web = await make_broker(), await make_broker()
    texts = [f"Rename file {n}?" for n in range(3)] + [f"Pay invoice {n}?" for n in range(2)]
    async with web_service(web, namespace, policies=policies) as (service, asks):
        async with asyncio.timeout(20):
            asks += [asyncio.create_task(asker.ask(asking(text), timeout=20)) for text in texts]
            while len(service.requests()) < 5:
                await asyncio.sleep(0.02)
        alice = service.snapshot(user="alice", window=10)
        assert alice["total"] == 3 and len(alice["requests"]) == 3
        assert all(service.may_see(v, "alice") and not v.get("routes") for v in alice["requests"])
        narrow = service.snapshot(user="alice", window=2)
        assert narrow["total"] == 3 and len(narrow["requests"]) == 2
        assert narrow["after"] == service.seq_of(narrow["requests"][-1]["id"])
        bob = service.snapshot(user="bob", window=10)
        assert bob["total"] == 5 and len(bob["requests"]) == 5


@pytest.mark.timeout(30)
async def test_a_card_an_urgent_asker_joins_moves_first_and_reaches_a_page_whose_window_is_full(
    make_broker: Callable[..., Any], namespace: str
) -> None:
    """Three normal cards, a page holding the first two; another asker asks the third's question urgently (one
    card, coalesced): the card is listed first now, and the page is sent it in full, not only counted."""
    asker, other, web = await make_broker(), await make_broker(), await make_broker()
    async with web_service(web, namespace) as (service, asks):
        async with asyncio.timeout(20):
            for text in ("First?", "Second?", "Third?"):  # one at a time: each shown before the next is asked
                asks.append(asyncio.create_task(asker.ask(asking(text), timeout=20)))
                while len(service.requests()) < len(asks):
                    await asyncio.sleep(0.02)
            window = PageWindow(2)
            async with service.subscribe(user="alice", window=2) as queue:
                snapshot = window.pass_on(await queue.get() or {}, 3, service.seq_of)
                assert [v["questions"][0]["question"] for v in snapshot["requests"]] == ["First?", "Second?"]
                urgent = AskUserQuestionRequest(questions=asking("Third?").questions, priority="urgent")
                asks.append(asyncio.create_task(other.ask(urgent, timeout=20)))
                while True:
                    event = window.pass_on(await queue.get() or {}, 3, service.seq_of)
                    if event["type"] == "added":
                        break
        assert event["request"]["questions"][0]["question"] == "Third?" and event["request"]["priority"] == "urgent"
        assert service.requests()[0]["id"] == event["request"]["id"]
        assert service.page(0, 1, lambda view: True)[0][0]["id"] == event["request"]["id"]
