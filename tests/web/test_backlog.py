"""A backlog (a failover with many pending): the web provider reads it a batch at a time and pages get it in batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import one_question
from workers.answering.web.keys import WebKeys
from workers.answering.web.service import QUEUE_SIZE, Event, WebProvider

BACKLOG = 1200
"""more cards than a page's queue holds events"""


def cards(event: Event) -> list[dict[str, Any]]:
    if event["type"] == "added":
        return [event["request"]]
    if event["type"] == "addedMany":
        return list(event["requests"])
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
            shown = [card["id"] for event in events if event is not None for card in cards(event)]
            assert sorted(shown) == sorted(view["id"] for view in service.requests())
            assert len(shown) == BACKLOG
            page, _ = service.page(0, 100, lambda view: True)
            assert len(page) == 100 and all(view["deadlineMs"] for view in page)  # the context was read
    finally:
        tasks = [*asks, *([running] if running else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
