"""A provider process for failover tests: answers each request with one label after a delay.

python -m tests.provider_process URL NAMESPACE NAME LABEL DELAY LEASE_TTL
Prints one line per event (STANDBY, HOLDING <epoch>, GOT <rid>, ANSWERED <rid>, REFUSED <rid> <code>, FENCED).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, Broker, PendingRequest, UserQuestionError
from tests.helpers import KEYS


def say(*words: object) -> None:
    print(*words, flush=True)


async def answer_later(pending: PendingRequest, label: str, delay: float) -> None:
    await asyncio.sleep(delay)
    items = tuple(AskUserQuestionAnswerItem(id=q.id, selected=(label,)) for q in pending.request.questions)
    try:
        await pending.answer(AskUserQuestionAnswer(answers=items))
        say("ANSWERED", pending.request_id)
    except UserQuestionError as error:
        say("REFUSED", pending.request_id, error.code)


async def provide(
    broker: Broker,
    name: str,
    answer: Callable[[PendingRequest], Coroutine[Any, Any, None]],
    say: Callable[..., None] = say,
) -> None:
    """Hold the lease as ``name`` until fenced, each card answered by ``answer`` in a task of its own;
    ``say`` tells STANDBY, HOLDING, GOT and FENCED (tests/keyed_provider.py says them on stderr)."""
    async with broker, broker.provider(name, on_standby=lambda holder: say("STANDBY", holder)) as provider:
        say("HOLDING", provider.epoch)
        async with asyncio.TaskGroup() as tasks:
            try:
                async for pending in provider:
                    say("GOT", pending.request_id, len(pending.askers))
                    tasks.create_task(answer(pending))
            except UserQuestionError as error:
                say("FENCED", error.code)


async def main(url: str, namespace: str, name: str, label: str, delay: float, lease_ttl: float) -> None:
    broker = Broker(url, namespace, lease_ttl=lease_ttl, **KEYS)
    await provide(broker, name, lambda pending: answer_later(pending, label, delay))


if __name__ == "__main__":
    url, namespace, name, label, delay, ttl = sys.argv[1:7]
    asyncio.run(main(url, namespace, name, label, float(delay), float(ttl)))
