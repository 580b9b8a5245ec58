"""Found by the benchmark: closing the asking broker right after an answer leaves that request's keys.

`Inbox._resolve` resolves the ask's future, then queues `UNLINK ans:<rid> req:<rid>` on the
command sender; a caller that closes its broker as soon as `ask()` returns cancels the sender
(and `fail_pending` drops the queued UNLINK), so both keys stay until `result_ttl` (600 s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from tests.helpers import one_question, pick, request_residue


async def test_closing_right_after_an_answer_leaves_no_request_keys(
    make_broker: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    provider_side = await make_broker()
    asker = await make_broker()
    async with provider_side.provider("ui") as provider:
        asking = asker.ask(one_question())

        async def answer_first() -> None:
            async for pending in provider:
                await pending.answer(pick("yes"))
                return

        answer, _ = await asyncio.gather(asking, answer_first())
        assert answer == pick("yes")
        await asker.aclose()  # at once, as a script that asked one question and exits would
    assert await request_residue(redis, namespace) == []
