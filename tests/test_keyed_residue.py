"""Residue of a keyed ask ended by housekeeping (issue 23, case 11): its durable key goes with it.

A keyed ask's durable key (``qb:{NS}:key:<digest>``) lives 2 x the request TTL + the detach grace, so
that it outlives any request it may name. A request that housekeeping ends (its deadline passed, its
asker stayed away past the grace, or its answer was never collected) needs the key no longer: a
re-attach would ask anew. The script that ends the request releases the key then, when it still
names that request; nothing of the ask outlives its need by more than the result TTL.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Broker, PendingRequest, Provider
from broker.operating.housekeeping import end_away, expire_overdue
from tests.helpers import one_question, pick

pytestmark = pytest.mark.timeout(30)

KEY = "nightly-7"


async def detached(broker: Broker, provider: Provider, **options: Any) -> PendingRequest:
    """A keyed ask of agent 'ci', shown to ``provider``, then cancelled (detached); the agent stops."""
    async with broker.agent("ci") as agent:
        task = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, **options))
        pending = await asyncio.wait_for(anext(aiter(provider)), 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    async with asyncio.timeout(5):
        while not pending.asker_away:
            await asyncio.sleep(0.02)
    return pending


async def names(redis: Redis, broker: Broker) -> str | None:
    value: str | None = await redis.get(broker.keys.durable("ci", KEY))
    return value


async def test_a_keyed_request_ended_after_its_grace_releases_its_durable_key(make_broker, redis):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        pending = await detached(await make_broker(), provider, detach_grace=0.3)
        assert await names(redis, holder) == pending.request_id
        await asyncio.sleep(0.5)
        assert await end_away(holder) == [pending.request_id]
    assert await names(redis, holder) is None


async def test_a_keyed_request_expired_past_its_deadline_releases_its_durable_key(make_broker, redis):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        pending = await detached(await make_broker(), provider, timeout=0.6, detach_grace=60)
        assert await names(redis, holder) == pending.request_id
        await asyncio.sleep(0.8)
        assert await expire_overdue(holder) == [pending.request_id]
    assert await names(redis, holder) is None


async def test_an_uncollected_keyed_answer_releases_its_durable_key_when_it_lapses(make_broker, redis):
    holder = await make_broker(result_ttl=0.5)
    async with holder.provider("ui") as provider:
        # the outcome is kept for the grace (1 s) for an asker that never comes back; the away set for the
        # grace and the result TTL (1.5 s)
        pending = await detached(await make_broker(result_ttl=0.5), provider, detach_grace=1.0)
        await pending.answer(pick("yes"))
        await asyncio.sleep(1.2)
        assert await end_away(holder) == []  # ended 'uncollected' (not a second end)
    assert await redis.exists(holder.keys.request(pending.request_id), holder.keys.outcome(pending.request_id)) == 0
    assert await names(redis, holder) is None


async def test_a_durable_key_naming_a_newer_request_is_left_alone(make_broker, redis):
    """The key was taken by a new ask of the same key since: ending the old request keeps it."""
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        pending = await detached(await make_broker(), provider, detach_grace=0.3)
        await redis.set(holder.keys.durable("ci", KEY), "a-newer-request")
        await asyncio.sleep(0.5)
        assert await end_away(holder) == [pending.request_id]
    assert await names(redis, holder) == "a-newer-request"


async def test_after_release_the_same_key_asks_anew_and_is_answered(make_broker, redis):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        old = await detached(await make_broker(), provider, detach_grace=0.3)
        await asyncio.sleep(0.5)
        assert await end_away(holder) == [old.request_id]
        asker = await make_broker()
        async with asker.agent("ci") as agent:
            again = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
            fresh = await asyncio.wait_for(anext(aiter(provider)), 10)
            assert fresh.request_id != old.request_id
            await fresh.answer(pick("no"))
            assert await asyncio.wait_for(again, 10) == pick("no")


@pytest.mark.parametrize("settle", ["answer", "cancel"])
async def test_a_keyed_request_settled_while_away_keeps_its_durable_key_no_longer_than_its_hash(
    make_broker, redis, settle
):
    """Without the maintenance worker: settling a keyed request gives its durable key the request hash's TTL
    (not 2 x the request TTL), so an answer never collected leaves nothing behind once its request lapses."""
    holder = await make_broker(result_ttl=2.0)
    async with holder.provider("ui") as provider:
        pending = await detached(await make_broker(result_ttl=2.0), provider, detach_grace=1.0)
        if settle == "answer":
            await pending.answer(pick("yes"))
        else:
            await pending.cancel()
    durable, request = holder.keys.durable("ci", KEY), holder.keys.request(pending.request_id)
    assert await redis.get(durable) == pending.request_id  # still there for an asker that re-attaches
    key_left, hash_left = await redis.pttl(durable), await redis.pttl(request)
    assert 0 < key_left <= hash_left + 200, (key_left, hash_left)
