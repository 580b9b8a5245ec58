"""A provider process that answers each request with one label and remembers the answer.

python -m tests.decision_provider URL NAMESPACE NAME LABEL SCOPE TTL BY [DELAY]
SCOPE is ``agent``, ``namespace`` or ``none``; a request that cannot be remembered (its asker
opted out, or no agent for scope ``agent``) is answered without remembering.
Prints one line per event: HOLDING <epoch>, GOT <rid> <opted-out 0|1>, ANSWERED <rid> <remembered 0|1>,
REFUSED <rid> <code>.
"""

from __future__ import annotations

import asyncio
import sys

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    Broker,
    PendingRequest,
    Remember,
    UserQuestionError,
)
from tests.helpers import KEYS


def say(*words: object) -> None:
    print(*words, flush=True)


async def answer(pending: PendingRequest, label: str, remember: Remember | None, by: str, delay: float) -> None:
    await asyncio.sleep(delay)
    items = tuple(AskUserQuestionAnswerItem(id=q.id, selected=(label,)) for q in pending.request.questions)
    reply = AskUserQuestionAnswer(answers=items)
    if remember is not None and not pending.can_remember(reply, remember.scope):
        remember = None
    try:
        await pending.answer(reply, by=by, remember=remember)
        say("ANSWERED", pending.request_id, 1 if remember else 0)
    except UserQuestionError as error:
        say("REFUSED", pending.request_id, error.code)


async def main(url: str, namespace: str, name: str, label: str, scope: str, ttl: float, by: str, delay: float) -> None:
    remember = None if scope == "none" else Remember(scope="agent" if scope == "agent" else "namespace", ttl=ttl)
    broker = Broker(url, namespace, lease_ttl=2.0, **KEYS)
    async with broker, broker.provider(name) as provider:
        say("HOLDING", provider.epoch)
        async with asyncio.TaskGroup() as tasks:
            async for pending in provider:
                say("GOT", pending.request_id, 1 if pending.opted_out else 0)
                tasks.create_task(answer(pending, label, remember, by, delay))


if __name__ == "__main__":
    url, namespace, name, label, scope, ttl, by = sys.argv[1:8]
    delay = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
    asyncio.run(main(url, namespace, name, label, scope, float(ttl), by, delay))
