"""Background work that a resource owns: started by it, cancelled and awaited when it closes.

Not a TaskGroup: a TaskGroup cancels the task that opened it when one of its children fails,
so a Redis failure in a background loop would cancel the caller's own task. Here a crashed
task is logged and, when asked, started again after a backoff; nothing propagates to the owner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from .backoff import Backoff

__all__ = ["Background", "running"]

log = logging.getLogger(__name__)

_CANCEL_AGAIN_AFTER = 0.05
"""seconds a cancelled background task may run on before it is cancelled again"""


class Background:
    """A set of named tasks; ``aclose()`` cancels and awaits them all."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(
        self, work: Callable[[], Coroutine[Any, Any, Any]], name: str, *, restart: bool = False
    ) -> asyncio.Task[Any]:
        """Run ``work()`` as a task; with ``restart``, run it again whenever it fails."""
        task = asyncio.create_task(_supervised(work, name) if restart else work(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def wait(self, timeout: float) -> bool:
        """Let the tasks finish by themselves for up to ``timeout`` seconds; True if all did."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        return not self._tasks

    async def aclose(self, grace: float = 5.0) -> None:
        """Cancel every task and wait up to ``grace`` seconds for them to end.

        The cancellation is repeated until the task ends, as anyio's level-triggered cancellation
        would: redis-py can lose one (a pooled connection is polled under a zero timeout before a
        command, and a cancellation that lands there is taken for that timeout's expiry), and the
        task then reads on. Bounded: a blocking read cancelled inside redis-py has been seen to
        never finish (a Sentinel client whose master was killed), and closing must not hang on it.
        Such a task is left behind with a warning; closing its client afterwards ends it.
        """
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + grace
        stuck = set(self._tasks)
        while stuck:
            for task in stuck:
                task.cancel()
            left = give_up_at - loop.time()
            if left <= 0:
                break
            _, stuck = await asyncio.wait(stuck, timeout=min(_CANCEL_AGAIN_AFTER, left))
        for task in stuck:
            log.warning("background task %s did not stop within %.0fs of its cancellation", task.get_name(), grace)


async def _supervised(work: Callable[[], Coroutine[Any, Any, Any]], name: str) -> None:
    backoff = Backoff(first=0.1, cap=5.0)
    while True:
        try:
            await work()
            return
        except Exception:
            delay = backoff.next()
            log.exception("background task %s failed; starting it again in %.1fs", name, delay)
            await asyncio.sleep(delay)


@asynccontextmanager
async def running(*work: Callable[[], Coroutine[Any, Any, Any]]) -> AsyncIterator[None]:
    """Run background work for the block; cancel and await it on the way out.

    Whatever the block raises comes out unwrapped (a TaskGroup would wrap it in an ExceptionGroup).
    """
    background = Background()
    for each in work:
        background.start(each, getattr(each, "__qualname__", "work"))
    try:
        yield
    finally:
        await background.aclose()
