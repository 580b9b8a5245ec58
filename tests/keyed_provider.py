"""A provider process for the combination tests: answers each card with its questions' first options.

python -m tests.keyed_provider URL NAMESPACE NAME DELAY LEASE_TTL MIN_REPLICAS REMEMBER_TTL

Each question's first option is its own token (the asker checks that it got the answer to its own
question), remembered for the namespace for REMEMBER_TTL seconds when the card allows it (0: never).
Prints on stderr, one line per event: STANDBY <holder>, HOLDING <epoch>, GOT <rid> <askers>,
ANSWERED <rid>, REFUSED <rid> <code>, FENCED <code>.
"""

from __future__ import annotations

import asyncio
import sys

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, Broker, PendingRequest, Remember, UserQuestionError
from tests.helpers import KEYS
from tests.provider_process import provide


def say(*words: object) -> None:
    print(*words, file=sys.stderr, flush=True)


async def answer_later(pending: PendingRequest, delay: float, remember_ttl: float) -> None:
    await asyncio.sleep(delay)
    items = tuple(
        AskUserQuestionAnswerItem(id=q.id, selected=(q.options[0].label,) if q.options else ())
        for q in pending.request.questions
    )
    reply = AskUserQuestionAnswer(answers=items)
    remember = Remember(scope="namespace", ttl=remember_ttl) if remember_ttl > 0 else None
    if remember is not None and not pending.can_remember(reply):
        remember = None
    try:
        await pending.answer(reply, remember=remember)
        say("ANSWERED", pending.request_id)
    except UserQuestionError as error:
        say("REFUSED", pending.request_id, error.code)


async def main(
    url: str, namespace: str, name: str, delay: float, lease_ttl: float, replicas: int, remember: float
) -> None:
    broker = Broker(url, namespace, lease_ttl=lease_ttl, min_replicas=replicas, replica_timeout=2.0, **KEYS)
    await provide(broker, name, lambda pending: answer_later(pending, delay, remember), say)


if __name__ == "__main__":
    url, namespace, name, delay, lease_ttl, replicas, remember = sys.argv[1:8]
    asyncio.run(main(url, namespace, name, float(delay), float(lease_ttl), int(replicas), float(remember)))
