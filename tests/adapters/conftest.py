"""A real provider on the test Redis that answers like a human would, and a live agent to ask as."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from broker import Agent, AskUserQuestionAnswer, AskUserQuestionRequest, Broker

Respond = Callable[[AskUserQuestionRequest], AskUserQuestionAnswer | str]
"""An answer, or a string: cancel with that reason."""


class Human:
    """Answers each request with ``respond``; ``seen`` keeps what it was asked."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.seen: list[AskUserQuestionRequest] = []


@pytest.fixture
async def human(make_broker: Callable[..., Any]) -> AsyncIterator[Callable[[Respond], Any]]:
    tasks: list[asyncio.Task[None]] = []

    async def start(respond: Respond) -> Human:
        broker: Broker = await make_broker()
        person = Human(respond)
        ready = asyncio.Event()

        async def serve() -> None:
            async with broker.provider("test-human") as provider:
                ready.set()
                async for pending in provider:
                    person.seen.append(pending.request)
                    reply = person.respond(pending.request)
                    if isinstance(reply, str):
                        await pending.cancel(reply, by="test-human")
                    else:
                        await pending.answer(reply, by="test-human")

        tasks.append(asyncio.create_task(serve()))
        await asyncio.wait_for(ready.wait(), 10)
        return person

    yield start
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def agent(make_broker: Callable[..., Any]) -> AsyncIterator[Agent]:
    broker: Broker = await make_broker()
    async with broker.agent("adapter-test") as live:
        yield live
