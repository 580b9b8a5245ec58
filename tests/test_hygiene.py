"""Invariants 6, 7 and 9: O(1) connections, nothing left behind, the token stays secret."""

from __future__ import annotations

import asyncio

from tests.helpers import next_pending, one_question, pick, request_residue, trail


async def connections_of(redis, client_id: str) -> int:
    return sum(1 for c in await redis.client_list() if c.get("name") == f"qb-{client_id}")


async def test_a_thousand_waiting_asks_hold_two_connections(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        asks = [asyncio.create_task(asking.ask(one_question())) for _ in range(1000)]
        while await redis.xlen(asking.keys.requests) < 1000:
            await asyncio.sleep(0.05)
        # one for commands, one for the inbox waiter, however many asks wait
        assert await connections_of(redis, asking.client_id) == 2
        for _ in range(1000):
            await (await next_pending(provider)).answer(pick("yes"))
        assert await asyncio.gather(*asks) == [pick("yes")] * 1000


async def test_nothing_but_the_audit_is_left_once_answered(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider, asking.agent("root") as agent:
        asks = [asyncio.create_task(agent.ask(one_question())) for _ in range(20)]
        for _ in range(20):
            await (await next_pending(provider)).answer(pick("no"))
        await asyncio.gather(*asks)
        assert await request_residue(redis, asking.namespace) == []
        assert await redis.xlen(asking.keys.requests) == 0
        assert (await redis.xpending(asking.keys.requests, "providers"))["pending"] == 0


async def test_every_key_carries_the_namespace_hash_tag(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider, asking.agent("root") as agent:
        task = asyncio.create_task(agent.ask(one_question()))
        await next_pending(provider)
        keys = await redis.keys(f"*{asking.namespace}*")
        assert len(keys) >= 8
        assert all(k.startswith(f"qb:{{{asking.namespace}}}:") for k in keys)
        task.cancel()


async def test_the_audit_records_who_asked_and_who_answered_under_which_epoch(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider, asking.agent("root") as agent:
        task = asyncio.create_task(agent.ask(one_question()))
        pending = await next_pending(provider)
        await pending.answer(pick("yes"), by="alice")
        await task
    events = [f for f in await trail(redis, asking.keys) if f.get("rid") == pending.request_id]
    assert [e["event"] for e in events] == ["asked", "answered"]  # who was given it: the hash's `delivered`
    assert events[0]["agent"] == "root"
    assert events[1]["provider"] == "ui" and events[1]["epoch"] == str(provider.epoch) and events[1]["by"] == "alice"


async def test_the_audit_stream_is_capped(make_broker, redis):
    asking, answering = await make_broker(audit_maxlen=10), await make_broker(audit_maxlen=10)
    async with answering.provider("ui") as provider:
        for _ in range(30):
            task = asyncio.create_task(asking.ask(one_question()))
            await (await next_pending(provider)).answer(pick("yes"))
            await task
    assert await redis.xlen(asking.keys.audit) < 90  # approximate trimming, far below 3 x 30
    assert 0 < await redis.xlen(asking.keys.asklog) < 90  # the askers' log too


async def test_the_agent_token_never_reaches_redis_providers_or_the_audit(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider, asking.agent("root") as agent:
        task = asyncio.create_task(agent.ask(one_question()))
        pending = await next_pending(provider)
        dump = []
        for key in await redis.keys(f"qb:{{{asking.namespace}}}:*"):
            kind = await redis.type(key)
            if kind == "string":
                dump.append(await redis.get(key))
            elif kind == "hash":
                dump.append(repr(await redis.hgetall(key)))
            elif kind == "stream":
                dump.append(repr(await redis.xrange(key)))
            elif kind == "list":
                dump.append(repr(await redis.lrange(key, 0, -1)))
            elif kind == "zset":
                dump.append(repr(await redis.zrange(key, 0, -1)))
        assert agent.token not in "".join(dump)
        slots = [name for cls in type(pending).__mro__ for name in getattr(cls, "__slots__", ())]
        held = repr([getattr(pending, name, None) for name in slots])  # everything the card holds
        assert slots and agent.token not in repr(pending.request) + repr(agent) + held
        await pending.answer(pick("yes"))
        await task


async def test_an_agent_record_lives_while_heartbeating_and_leaves_on_exit(make_broker, redis):
    broker = await make_broker(agent_ttl=0.6)
    async with broker.agent("root") as agent:
        await asyncio.sleep(1.5)  # longer than the TTL: the heartbeat keeps it
        assert await redis.exists(broker.keys.agent("root")) == 1
        assert agent.alive
    assert await redis.exists(broker.keys.agent("root")) == 0
    assert not agent.alive
