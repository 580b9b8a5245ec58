"""A backlog (a failover with many pending): the web provider reads it a batch at a time and pages get it in batches."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import one_question
from workers.answering.web.keys import WebKeys
from workers.answering.web.service import QUEUE_SIZE, Event, WebProvider

BACKLOG = 1200
"""more cards than a page's queue holds events"""


def cards(event: Event, service: WebProvider) -> list[dict[str, Any]]:
    """The cards an event brings a page, built as a page's stream builds them (``WebProvider.built``)."""
    if event["type"] == "added":
        return [event["request"]]
    if event["type"] == "addedMany":
        return service.built(event["requests"])
    return []


@pytest.mark.timeout(50)
async def test_a_backlog_reaches_a_page_in_batches_without_overflowing_its_queue(
    make_broker: Callable[..., Any], namespace: str
) -> None:
    asker, old, web = await make_broker(), await make_broker(), await make_broker()
    service = WebProvider(web, name="web-1", keys=WebKeys(namespace))
    running: asyncio.Task[None] | None = None
    asks: list[asyncio.Task[Any]] = []
    try:
        async with asyncio.timeout(40), asker.agent("builder") as builder:
            async with old.provider("old") as holder:
                asks = [  # half of them an agent's: its record is read too
                    asyncio.create_task((builder if n % 2 else asker).ask(one_question("yes", f"no {n}"), timeout=40))
                    for n in range(BACKLOG)
                ]
                while holder.pending_count < BACKLOG:
                    await asyncio.sleep(0.05)
                # A page that is slow to read: its queue holds QUEUE_SIZE events, then it is dropped.
                subscribed = service.subscribe(asyncio.Queue(QUEUE_SIZE))
                queue = await subscribed.__aenter__()
                running = asyncio.create_task(service.run())
                while service.status != "standby":
                    await asyncio.sleep(0.02)
            # the old holder let go: the web provider takes the lease and the backlog
            while len(service.requests()) < BACKLOG:
                await asyncio.sleep(0.02)
            events = [queue.get_nowait() for _ in range(queue.qsize())]
            await subscribed.__aexit__(None, None, None)
            assert None not in events, "the page was dropped: more events than its queue holds"
            shown = [card["id"] for event in events if event is not None for card in cards(event, service)]
            assert sorted(shown) == sorted(view["id"] for view in service.requests())
            assert len(shown) == BACKLOG
            page, _ = service.page(0, 100, lambda view: True)
            assert len(page) == 100 and all(view["deadlineMs"] for view in page)  # the context was read
    finally:
        tasks = [*asks, *([running] if running else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.timeout(60)
async def test_poison_entries_amid_a_backlog_lose_no_card_and_show_none_twice(
    make_broker: Callable[..., Any], namespace: str, redis: Any
) -> None:
    """A take-over's batches with bad entries among good ones (an id that is no id, a request hash that is gone,
    a request that does not decode): the bad are set aside, every good card reaches the page exactly once, and a
    card withdrawn afterwards is taken down (one watcher for every card)."""
    asker, old, web = await make_broker(), await make_broker(), await make_broker()
    keys = asker.keys
    service = WebProvider(web, name="web-1", keys=WebKeys(namespace))
    running: asyncio.Task[None] | None = None
    asks: dict[str, asyncio.Task[Any]] = {}
    half = 300  # the bad entries sit in the middle of the take-over's second read (256 entries a read)

    def ask(n: int) -> None:
        asks[f"no {n}"] = asyncio.create_task(asker.ask(one_question("yes", f"no {n}"), timeout=50))

    try:
        async with asyncio.timeout(50):
            poison = {"state": "pending", "client": asker.client_id, "agent": "", "created": "1"}
            await redis.hset(keys.request("r-poison"), mapping=poison)
            async with old.provider("old") as holder:
                for n in range(half):
                    ask(n)
                while holder.pending_count < half:
                    await asyncio.sleep(0.05)
                # Read at once by a reader that is gone (a fenced one, say): they wait in the group's pending list,
                # between the asks, for the next holder's claim. (Blocked readers are served after EXEC.)
                async with redis.pipeline(transaction=True) as pipe:
                    pipe.xadd(keys.requests, {"kind": "ask", "rid": "not an id!", "client": asker.client_id})
                    pipe.xadd(keys.requests, {"kind": "ask", "rid": "r-missing", "client": asker.client_id})
                    pipe.xadd(keys.requests, {"kind": "ask", "rid": "r-poison", "client": asker.client_id,
                                              "request": "{not json"})  # fmt: skip
                    pipe.xreadgroup("providers", "gone-reader", {keys.requests: ">"}, count=3)
                    *_, read = await pipe.execute()
                assert len(read[0][1]) == 3
                for n in range(half, 2 * half):
                    ask(n)
                while holder.pending_count < 2 * half:
                    await asyncio.sleep(0.05)
                queue: asyncio.Queue[Event | None] = asyncio.Queue()
                subscribed = service.subscribe(queue)
                await subscribed.__aenter__()
                running = asyncio.create_task(service.run())
                while service.status != "standby":
                    await asyncio.sleep(0.02)
            while len(service.requests()) < 2 * half:
                await asyncio.sleep(0.02)
            shown = [
                card for _ in range(queue.qsize()) if (event := queue.get_nowait()) for card in cards(event, service)
            ]
            assert len(shown) == 2 * half and len({card["id"] for card in shown}) == 2 * half
            labels = {card["questions"][0]["options"][1]["label"]: card["id"] for card in shown}
            assert sorted(labels) == sorted(asks)
            dead = await redis.xrange(keys.dead)
            assert sorted(json.loads(fields["fields"])["rid"] for _, fields in dead) == ["not an id!", "r-poison"]
            assert (await redis.xpending(keys.requests, "providers"))["pending"] == 2 * half  # the bad ones left it
            for label in ("no 7", "no 400"):  # withdrawn once shown: taken down
                asks[label].cancel()
            while {labels["no 7"], labels["no 400"]} & {view["id"] for view in service.requests()}:
                await asyncio.sleep(0.02)
            removed = [queue.get_nowait() for _ in range(queue.qsize())]
            gone = [event["id"] for event in removed if event and event["type"] == "removed"]
            assert sorted(gone) == sorted([labels["no 7"], labels["no 400"]])
            await subscribed.__aexit__(None, None, None)
    finally:
        tasks = [*asks.values(), *([running] if running else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.timeout(60)
async def test_a_backlog_builds_only_the_views_a_pages_window_is_sent(
    make_broker: Callable[..., Any], namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: at a failover, a page's window keeps the first cards of the backlog's ``addedMany`` events and counts
    the rest; only the views it is sent are built (every card's view was about a fifth of a take-over's CPU), each
    the view the API gives of that card."""
    import workers.answering.web.cards as cards_module
    import workers.answering.web.delivery as delivery_module
    from workers.answering.web.window import PageWindow

    built: list[str] = []

    def counted(build: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
        def view(pending: Any) -> dict[str, Any]:
            built.append(pending.request_id)
            return build(pending)

        return view

    for module in (cards_module, delivery_module):
        monkeypatch.setattr(module, "request_view", counted(module.request_view))
    asker, old, web = await make_broker(), await make_broker(), await make_broker()
    service = WebProvider(web, name="web-1", keys=WebKeys(namespace))
    running: asyncio.Task[None] | None = None
    asks: list[asyncio.Task[Any]] = []
    backlog, size = 400, 100
    try:
        async with asyncio.timeout(50):
            async with old.provider("old") as holder:
                asks = [
                    asyncio.create_task(asker.ask(one_question("yes", f"no {n}"), timeout=50)) for n in range(backlog)
                ]
                while holder.pending_count < backlog:
                    await asyncio.sleep(0.05)
                subscribed = service.subscribe(asyncio.Queue())
                queue = await subscribed.__aenter__()
                running = asyncio.create_task(service.run())
                while service.status != "standby":
                    await asyncio.sleep(0.02)
            while len(service.cards.pending) < backlog:
                await asyncio.sleep(0.02)
            events = [event for _ in range(queue.qsize()) if (event := queue.get_nowait()) is not None]
            await subscribed.__aexit__(None, None, None)
            alone = [event["request"]["id"] for event in events if event["type"] == "added"]
            assert sorted(built) == sorted(alone), "views were built for cards no page was sent yet"
            assert sum(len(event["requests"]) for event in events if event["type"] == "addedMany") > size

            built.clear()
            window, sent = PageWindow(size), []
            for event in events:  # as a page's stream passes them on (stream.py)
                passed = window.pass_on(event, len(service.cards.pending), service.seq_of)
                if passed["type"] == "addedMany":
                    sent += service.built(passed["requests"])
                elif passed["type"] == "added":
                    sent.append(passed["request"])
            assert len(sent) == size
            assert len(built) <= size  # the window's, not the backlog's
            assert sent == [service.view_of(view["id"]) for view in sent]
    finally:
        tasks = [*asks, *([running] if running else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
