from __future__ import annotations

import asyncio

from tests.helpers import one_question, pick


async def test_round_trip(make_broker):
    asking = await make_broker()
    answering = await make_broker()
    async with answering.provider("p1") as provider:
        task = asyncio.create_task(asking.ask(one_question()))
        pending = await anext(aiter(provider))
        await pending.answer(pick("yes"))
        result = await asyncio.wait_for(task, 5)
    assert result == pick("yes")
