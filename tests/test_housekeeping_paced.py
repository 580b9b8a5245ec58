"""Paced housekeeping (``housekeep_slice``): a round reads a slice of the pending requests, never all of them,
and a pass still looks at every one (issue 27: a waiting question costs at most 0.02 commands a second).

Counts, not times: the commands a round sends are read from the server's ``INFO commandstats``, and the bound
is a number of rounds. The asking side is made quiet (hour-long TTLs and sweep), so the commands counted are
housekeeping's.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import AskUserQuestionRequest, UserQuestionError
from broker.operating.housekeeping import (
    PASS_SECONDS,
    SLICE_FLOOR,
    HousekeepingReport,
    housekeep_slice,
    run_housekeeping,
    slice_size,
)
from tests.helpers import question

pytestmark = pytest.mark.timeout(90)

N = 1000
EVERY = 3.0
QUIET = {"agent_ttl": 3600.0, "client_ttl": 3600.0, "sweep_every": 3600.0}
"""an asking broker that sends nothing while it waits (its beats and sweeps are an hour apart)"""


def step(i: int) -> AskUserQuestionRequest:
    """A question of its own (identical questions would share one card)."""
    return AskUserQuestionRequest(questions=(question("q1", "yes", "no", detail=f"step {i}"),))


async def _calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}
    calls["total"] = int((await redis.info("stats"))["total_commands_processed"])
    return calls


def _spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands sent between two readings, less the INFO commands that read them."""
    spent = {name: count - before.get(name, 0) for name, count in after.items()}
    spent["total"] -= 2
    spent["info"] = spent.get("info", 0) - 2
    return spent


async def _shown(provider: Any, n: int) -> None:
    async with asyncio.timeout(60):
        while provider.pending_count < n:
            await asyncio.sleep(0.05)


async def _rids(redis: Redis, broker: Any) -> list[str]:
    """The asks' request ids in stream order (the order a pass visits them)."""
    return [f["rid"] for _, f in await redis.xrange(broker.keys.requests) if f.get("kind") == "ask"]


def test_a_pass_takes_at_most_the_rounds_of_pass_seconds_however_many_wait():
    for n in (1, SLICE_FLOOR, 1000, 10_000, 100_000, 1_000_000):
        size = slice_size(n, EVERY)
        assert size >= SLICE_FLOOR
        assert math.ceil(n / size) <= max(1, math.ceil(PASS_SECONDS / EVERY)), n
    assert slice_size(100_000, EVERY) == 2500  # 0.0083 HMGET a second per waiting question
    assert slice_size(SLICE_FLOOR, EVERY) == SLICE_FLOOR  # up to the floor, a round is a whole pass


async def test_a_round_reads_a_slice_and_a_pass_reads_each_request_once(make_broker, redis):
    asking, answering = await make_broker(**QUIET), await make_broker(lease_ttl=3600.0)
    async with answering.provider("ui") as provider:
        tasks = [asyncio.create_task(asking.ask(step(i))) for i in range(N)]
        await _shown(provider, N)
        rounds, read, scripts = 0, [], 0
        done = False
        while not done:
            report = HousekeepingReport()
            before = await _calls(redis)
            done = await housekeep_slice(answering, EVERY, report)
            spent = _spent(before, await _calls(redis))
            rounds += 1
            read.append(spent.get("hmget", 0))
            scripts += spent.get("evalsha", 0) + spent.get("eval", 0)
            # one HMGET per request in the slice, and a few more: the cursor, the length, the page, the clock,
            # one liveness read per asking process and agent (one here)
            assert spent["total"] <= SLICE_FLOOR + 8, spent
            assert report.withdrawn == report.expired == [] and report.stale_entries == 0
            assert rounds <= N, "the pass never ended"
        assert rounds == math.ceil(N / SLICE_FLOOR)
        assert read == [SLICE_FLOOR] * (N // SLICE_FLOOR) + [N % SLICE_FLOOR]  # every request once a pass
        assert scripts == 0  # every asker is live: no script had anything to do
        assert not any(task.done() for task in tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_many_pending_and_a_dead_asker_it_is_still_withdrawn_within_a_pass_and_a_round(make_broker, redis):
    """The worst case: its asker dies just after the cursor passed its request. It is withdrawn in the next
    pass, so within the rounds of one pass and one more; the other cases (its agent record gone, a deadline
    passed, an away asker found live again) are acted on by the same pass."""
    asking, answering = await make_broker(**QUIET), await make_broker(lease_ttl=3600.0)
    stopped, agent_gone = await make_broker(**QUIET), await make_broker(**QUIET)
    keys = asking.keys
    async with answering.provider("ui") as provider, agent_gone.agent("planner") as agent:
        tasks = [asyncio.create_task(asking.ask(step(i))) for i in range(N // 2)]
        await _shown(provider, N // 2)
        doomed = asyncio.create_task(stopped.ask(step(-1)))
        orphan = asyncio.create_task(agent.ask(step(-2)))
        overdue = asyncio.create_task(asking.ask(step(-3), timeout=3600))
        away = asyncio.create_task(asking.ask(step(-4), key="k1"))
        await _shown(provider, N // 2 + 4)
        tasks += [asyncio.create_task(asking.ask(step(i))) for i in range(N // 2, N)]
        await _shown(provider, N + 4)
        rids = await _rids(redis, asking)
        doomed_rid, orphan_rid, overdue_rid, away_rid = rids[N // 2 : N // 2 + 4]
        per_pass = math.ceil((N + 4) / SLICE_FLOOR)

        # the cursor goes past the four (entries N/2 .. N/2 + 3), then the asker dies
        for _ in range(math.ceil((N // 2 + 4) / SLICE_FLOOR)):
            assert not await housekeep_slice(answering, EVERY, HousekeepingReport())
        await redis.delete(stopped.keys.client(stopped.client_id))
        await redis.delete(keys.agent("planner"))
        await redis.hset(keys.request(overdue_rid), "deadline", 1)
        await redis.hset(keys.request(away_rid), "away", 1)
        await redis.zadd(keys.away, {away_rid: 2**50})

        report, rounds = HousekeepingReport(), 0
        while doomed_rid not in report.withdrawn:
            await housekeep_slice(answering, EVERY, report)
            rounds += 1
            assert rounds <= per_pass + 1, f"not withdrawn within {per_pass + 1} rounds"
        assert sorted(report.withdrawn) == sorted([doomed_rid, orphan_rid])
        assert report.expired == [overdue_rid]
        assert await redis.hget(keys.request(away_rid), "away") is None  # found live again: marked back
        assert await redis.zscore(keys.away, away_rid) is None
        for task, code in ((doomed, "CALLER_NOT_LIVE"), (orphan, "CALLER_NOT_LIVE"), (overdue, "ASK_TIMED_OUT")):
            with pytest.raises(UserQuestionError) as raised:
                await asyncio.wait_for(task, 10)
            assert raised.value.code == code
        assert not away.done() and not any(task.done() for task in tasks)
        for task in [*tasks, away]:
            task.cancel()
        await asyncio.gather(*tasks, away, return_exceptions=True)


async def test_with_many_pending_and_no_worker_the_provider_withdraws_a_dead_askers_request(make_broker, redis):
    """The lease holder's own loop (no maintenance worker alive) runs the paced rounds, and records what it did."""
    asking, stopped = await make_broker(**QUIET), await make_broker(**QUIET)
    answering = await make_broker(lease_ttl=3600.0, housekeeping_every=0.05)
    async with answering.provider("ui") as provider:
        tasks = [asyncio.create_task(asking.ask(step(i))) for i in range(N)]
        await _shown(provider, N)
        doomed = asyncio.create_task(stopped.ask(step(-1)))
        await _shown(provider, N + 1)
        await redis.delete(stopped.keys.client(stopped.client_id))
        with pytest.raises(UserQuestionError) as raised:
            await asyncio.wait_for(doomed, 60)
        assert raised.value.code == "CALLER_NOT_LIVE"
        async with asyncio.timeout(10):  # recorded once the round's scripts are done
            while not any(
                f["worker"] == "provider:ui" and f["withdrawn"] == "1"
                for _, f in await redis.xrange(f"{asking.keys.prefix}maintenance")
            ):
                await asyncio.sleep(0.05)
        assert not any(task.done() for task in tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_workers_run_reaps_one_paced_round_and_counts_the_stream(make_broker, redis):
    """A maintenance worker's run (``run_housekeeping`` with its interval) is one round, not a whole pass, and
    its pending count is the stream's length (one XLEN), not a read of every request."""
    asking, answering = await make_broker(**QUIET), await make_broker(lease_ttl=3600.0)
    async with answering.provider("ui") as provider:
        tasks = [asyncio.create_task(asking.ask(step(i))) for i in range(N)]
        await _shown(provider, N)
        before = await _calls(redis)
        report = await run_housekeeping(answering, every=10.0)
        spent = _spent(before, await _calls(redis))
        assert spent.get("hmget", 0) == SLICE_FLOOR, spent
        assert report.pending == N
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
