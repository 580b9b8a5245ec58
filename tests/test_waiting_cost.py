"""What a waiting question costs Redis, and that the cheap sweep still ends every ask (issue 27).

The asker's sweep re-reads every awaited outcome and checks that every awaited request still
exists, every ``sweep_every``. Both go in batches (one MGET, one multi-key EXISTS per 1000 ids),
so a waiting question costs about 2 / 1000 commands per sweep rather than one EXISTS each;
only a batch whose count comes back short is split to find the requests that are gone.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from broker import AskUserQuestionRequest, UserQuestionError
from broker.errors import BROKER_UNAVAILABLE
from tests.helpers import question

pytestmark = pytest.mark.timeout(40)

SWEEP = 0.25
BUDGET_PER_SWEEP = 0.1
"""commands per waiting question per sweep: 0.02/s at the default sweep_every of 5 s"""


def step(i: int) -> AskUserQuestionRequest:
    """A question of its own (identical questions would share one card)."""
    return AskUserQuestionRequest(questions=(question("q1", "yes", "no", detail=f"step {i}"),))


async def _wait_shown(provider, n: int) -> None:
    async with asyncio.timeout(15):
        while provider.pending_count < n:
            await asyncio.sleep(0.05)


async def test_a_waiting_question_costs_at_most_a_tenth_of_a_command_per_sweep(make_broker, redis: Redis):
    n = 400
    asking, answering = await make_broker(sweep_every=SWEEP), await make_broker(lease_ttl=30.0)
    async with answering.provider("ui") as provider:
        tasks = [asyncio.create_task(asking.ask(step(i))) for i in range(n)]
        await _wait_shown(provider, n)
        await asyncio.sleep(2 * SWEEP)  # every ask is old enough to be swept
        before, started = (await redis.info("stats"))["total_commands_processed"], time.monotonic()
        await asyncio.sleep(10 * SWEEP)
        after, elapsed = (await redis.info("stats"))["total_commands_processed"], time.monotonic() - started
        sweeps = elapsed / SWEEP
        per_question = (after - before - 1) / n / sweeps  # less the INFO that read `before`
        assert per_question <= BUDGET_PER_SWEEP, f"{per_question:.3f} commands per waiting question per sweep"
        assert not any(task.done() for task in tasks)  # the sweep ended none of them
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_only_the_asks_whose_request_is_gone_end_and_within_three_sweeps(make_broker, redis: Redis):
    """The batch check is split only where its count comes back short: the asks whose request
    is gone end, each within 3 x ``sweep_every`` (two misses in a row); the others wait on."""
    n, gone_at = 40, (0, 17, 18, 39)
    asking, answering = await make_broker(sweep_every=SWEEP), await make_broker(lease_ttl=30.0)
    async with answering.provider("ui") as provider:
        tasks = [asyncio.create_task(asking.ask(step(i))) for i in range(n)]
        await _wait_shown(provider, n)
        by_step = {card.request.questions[0].detail: card.request_id for card in provider.pending}
        lost = [by_step[f"step {i}"] for i in gone_at]
        await redis.delete(*(asking.keys.request(request_id) for request_id in lost))
        started = time.monotonic()
        async with asyncio.timeout(3 * SWEEP + 2.0):
            for i in gone_at:
                with pytest.raises(UserQuestionError) as raised:
                    await tasks[i]
                assert raised.value.code == BROKER_UNAVAILABLE
        assert time.monotonic() - started < 3 * SWEEP + 1.0
        await asyncio.sleep(3 * SWEEP)
        assert [i for i, task in enumerate(tasks) if task.done()] == list(gone_at)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
