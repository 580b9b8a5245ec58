"""Closing the background work a broker or provider owns (broker/_tasks.py)."""

from __future__ import annotations

import asyncio

from broker._tasks import Background


async def test_a_task_that_loses_a_cancellation_still_stops_when_its_owner_closes() -> None:
    """redis-py polls a pooled connection under a zero timeout before a command; a cancellation
    that lands in that poll is taken for the timeout's expiry and lost, and the task reads on.
    A provider closing at that moment waited out the whole grace (5 s) before its lease was
    released (tests/test_provider.py::test_a_clean_release_hands_over_at_once_not_after_the_ttl
    met it). Here the task loses the first cancellation the same way."""
    lost = 0

    async def reads_on() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost += 1
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    background = Background()
    task = background.start(reads_on, "reads-on")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(background.aclose(grace=5.0), 10)
    assert lost == 1
    assert task.done()
    assert loop.time() - started < 1.0  # not the 5 s grace


async def test_a_task_that_never_stops_is_left_behind_after_the_grace() -> None:
    """Closing is bounded even when a task ignores every cancellation."""

    deaf = True

    async def never_stops() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if not deaf:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    background = Background()
    task = background.start(never_stops, "never-stops")
    await asyncio.sleep(0)
    await asyncio.wait_for(background.aclose(grace=0.3), 5)
    assert not task.done()
    deaf = False
    task.cancel()
    await asyncio.wait([task], timeout=5)
    assert task.cancelled()
