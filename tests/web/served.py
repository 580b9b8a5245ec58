"""The web provider run inside the test's process, for tests of what it holds and sends (no HTTP, no browser)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from broker import Agent, Broker
from tests.helpers import one_question, plan_review
from workers.answering.web.keys import WebKeys
from workers.answering.web.service import WebProvider


@contextlib.asynccontextmanager
async def web_service(
    web: Broker, namespace: str, **options: Any
) -> AsyncIterator[tuple[WebProvider, list[asyncio.Task[Any]]]]:
    """A running ``web-1`` holding the lease (an ask sent before it does would fail NO_PROVIDER), and a list for
    the test's ask tasks; on exit the asks and the service are cancelled."""
    service = WebProvider(web, name="web-1", keys=WebKeys(namespace), **options)
    running = asyncio.create_task(service.run())
    asks: list[asyncio.Task[Any]] = []
    try:
        async with asyncio.timeout(10):
            while service.status != "active":
                await asyncio.sleep(0.01)
        yield service, asks
    finally:
        for task in [*asks, running]:
            task.cancel()
        await asyncio.gather(*asks, running, return_exceptions=True)


async def ask_many_and_rare(
    service: WebProvider, many: Agent, rare: Agent, asks: list[asyncio.Task[Any]], *, timeout: float
) -> None:
    """The cards the filtered pages are read over: six questions and a plan review of agent ``many``, one
    question of ``rare``; back once ``service`` holds all eight."""
    for n in range(6):
        asks.append(asyncio.create_task(many.ask(one_question(f"a{n}", f"b{n}"), timeout=timeout)))
    asks.append(asyncio.create_task(rare.ask(one_question("yes", "no"), timeout=timeout)))
    asks.append(asyncio.create_task(many.ask(plan_review(), timeout=timeout)))
    while len(service.requests()) < 8:
        await asyncio.sleep(0.02)
