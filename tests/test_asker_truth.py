"""One truth about who is asking (issue 23): the request hash is the record of the asker.

Each test is one confirmed case of the issue, against a real redis-server; each broker stands for one
asking process (its own client id, inbox and liveness key). A process "stops" by closing its broker
(its liveness key then lapses after ``client_ttl``), or is a real process killed (tests/workers/procs.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Agent, AskUserQuestionAnswer, Broker, PendingRequest, Provider, Remember, UserQuestionError
from broker._lua import SCRIPTS
from broker.errors import BAD_ANSWER, CALLER_NOT_LIVE
from broker.operating.housekeeping import end_away, reap_abandoned, run_housekeeping
from tests.faultproxy import FaultProxy
from tests.helpers import one_question, pick, until
from tests.redis_server import FAST_SYNC, RedisServer

pytestmark = pytest.mark.timeout(60)

KEY = "release-9"


async def next_pending(provider: Provider, within: float = 10.0) -> PendingRequest:
    return await asyncio.wait_for(anext(aiter(provider)), within)


async def detached(broker: Broker, provider: Provider, **options: Any) -> PendingRequest:
    """A keyed ask of agent 'ci' in ``broker``, shown, then cancelled there (detached); the agent then stops."""
    async with broker.agent("ci") as agent:
        return await cancelled(agent, provider, **options)


async def asked_again(broker: Broker) -> AskUserQuestionAnswer:
    """The keyed ask asked anew by agent 'ci' in ``broker`` (the asker come back): what it gets within 5 s."""
    async with broker.agent("ci") as agent:
        return await asyncio.wait_for(agent.ask(one_question("yes", "no"), key=KEY), 5)


async def cancelled(agent: Agent, provider: Provider, **options: Any) -> PendingRequest:
    """A keyed ask of ``agent``, shown, then cancelled (detached) while the agent and its process live on."""
    task = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, **options))
    pending = await next_pending(provider)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await until(lambda: pending.asker_away)
    return pending


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as running:
        yield running


# -- case 1: housekeeping judges the asker the hash names, not the stream entry's -------------------------------


async def test_1_a_re_attached_ask_is_not_expired_under_its_live_asker(make_broker, redis):
    holder = await make_broker()
    housekeeper = await make_broker()
    async with holder.provider("ui") as provider:
        first = await make_broker(client_ttl=0.3)
        pending = await detached(first, provider, detach_grace=0.5)
        await first.aclose()  # its liveness lapses in 0.3 s
        second = await make_broker()
        async with second.agent("ci") as agent:
            again = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, detach_grace=0.5))
            await until(lambda: not pending.asker_away)
            await asyncio.sleep(0.5)  # the first process's liveness key is gone
            await reap_abandoned(housekeeper)
            await asyncio.sleep(0.6)  # past the grace: an away asker would now be ended
            assert await end_away(housekeeper) == []
            assert await redis.hget(holder.keys.request(pending.request_id), "state") == "pending"
            await pending.answer(pick("yes"))
            assert await asyncio.wait_for(again, 10) == pick("yes")


# -- case 2: a new lease holder's delivery judges the asker the hash names ------------------------------------------


async def test_2_a_new_holder_does_not_see_a_re_attached_asker_as_away(make_broker, redis):
    first = await make_broker(client_ttl=0.3)
    second = await make_broker()
    old, new = await make_broker(lease_ttl=1.0), await make_broker(lease_ttl=1.0)
    async with old.provider("old") as provider:
        await detached(first, provider)
    await first.aclose()
    async with second.agent("ci") as agent:
        again = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
        await asyncio.sleep(0.6)  # re-attached, and the first process's liveness key is gone
        async with new.provider("new") as provider:
            pending = await next_pending(provider)
            assert not pending.asker_away
            assert not await redis.hexists(new.keys.request(pending.request_id), "away")
            await pending.answer(pick("no"))
            assert await asyncio.wait_for(again, 10) == pick("no")


# -- case 3: with min_replicas an answer kept for an away asker is not deleted ---------------------------------------


async def test_3_min_replicas_keeps_the_answer_of_a_detached_asker_for_its_restart(make_broker, redis_factory):
    master = redis_factory(*FAST_SYNC)
    replica = redis_factory("--replicaof", "127.0.0.1", str(master.port))
    client = Redis.from_url(replica.url, decode_responses=True)
    try:
        await until(lambda: _link_up(client), 20)
    finally:
        await client.aclose()
    holder = await make_broker(url=master.url, min_replicas=1, replica_timeout=2.0)
    async with holder.provider("ui") as provider:
        first = await make_broker(url=master.url)  # stays open: detached, alive
        async with first.agent("ci") as alive:
            pending = await cancelled(alive, provider)
            await pending.answer(pick("yes"))
            await asyncio.sleep(0.3)  # the notice reached the detached process
        assert await asked_again(await make_broker(url=master.url)) == pick("yes")
        assert provider.pending == []


async def _link_up(client: Redis) -> bool:
    info = await client.info("replication")
    return info.get("master_link_status") == "up"


# -- case 5: a keyed ask cancelled in a process that keeps running stays away ---------------------------------------


async def test_5_a_detached_asker_that_keeps_running_stays_away_and_its_answer_waits(make_broker, redis):
    holder, housekeeper = await make_broker(), await make_broker()
    async with holder.provider("ui") as provider:
        first = await make_broker()  # the MCP server, say: it and its agent keep running
        async with first.agent("ci") as alive:
            pending = await cancelled(alive, provider)
            await reap_abandoned(housekeeper)
            assert await redis.hexists(holder.keys.request(pending.request_id), "away")
            await asyncio.sleep(0.2)
            assert pending.asker_away
            await pending.answer(pick("yes"))
            await asyncio.sleep(0.3)
        assert await asked_again(await make_broker()) == pick("yes")
        assert provider.pending == []


# -- case 6: a cancel while the re-attach script is in flight detaches what it attached -----------------------------


async def test_6_a_cancel_during_the_re_attach_leaves_the_question_for_the_next_asker(make_broker, redis, proxy):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await make_broker()
        pending = await detached(first, provider)
        second = await make_broker(url=proxy.url)  # keeps running
        async with second.agent("ci") as agent:
            proxy.delay(0.5)  # every reply comes late: the re-attach runs, its caller is cancelled meanwhile
            task = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
            await until(lambda: not pending.asker_away)  # ask.lua ran: the hash names the second process
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            proxy.heal()
            await until(lambda: pending.asker_away)
            await pending.answer(pick("no"))
            await asyncio.sleep(0.5)
        assert await asked_again(await make_broker()) == pick("no")
        assert provider.pending == []


# -- case 7: the opt-outs of a re-attach count ---------------------------------------------------------------------


async def test_7_remember_false_on_re_attach_is_the_requests_opt_out(make_broker, redis):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        pending = await detached(await make_broker(), provider)
        assert pending.rememberable
        second = await make_broker()
        async with second.agent("ci") as agent:
            again = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, remember=False, coalesce=False))
            await until(lambda: not pending.asker_away and not pending.rememberable)
            fields = await redis.hmget(holder.keys.request(pending.request_id), "remember", "coalesce")
            assert fields == ["0", "0"]
            with pytest.raises(UserQuestionError) as refused:
                await pending.answer(pick("yes"), remember=Remember())
            assert refused.value.code == BAD_ANSWER
            await pending.answer(pick("yes"))
            assert await asyncio.wait_for(again, 10) == pick("yes")
        assert await holder.decisions() == []


async def test_7_coalesce_false_on_re_attach_keeps_it_apart_at_the_next_delivery(make_broker, redis):
    old, new = await make_broker(lease_ttl=1.0), await make_broker(lease_ttl=1.0)
    second, other = await make_broker(), await make_broker()
    async with contextlib.AsyncExitStack() as stack:
        async with old.provider("old") as provider:
            pending = await detached(await make_broker(), provider)
            agent = await stack.enter_async_context(second.agent("ci"))
            peer = await stack.enter_async_context(other.agent("other"))
            again = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, coalesce=False))
            await until(lambda: not pending.asker_away)
            # an identical question of another agent: the next holder delivers both together
            theirs = asyncio.ensure_future(peer.ask(one_question("yes", "no")))
            await until(lambda: len(pending.askers) == 2)  # the old holder had it coalesce when first shown
        async with new.provider("new") as provider:
            await until(lambda: sum(len(c.askers) for c in provider.pending) == 2)
            assert [len(c.askers) for c in provider.pending] == [1, 1]
            for card in provider.pending:
                await card.answer(pick("yes"))
            assert await asyncio.wait_for(again, 10) == pick("yes")
            assert await asyncio.wait_for(theirs, 10) == pick("yes")


# -- case 9: a re-attach whose reply was lost still tells the process it replaced ----------------------------------


async def test_9_a_lost_re_attach_reply_still_ends_the_replaced_wait(make_broker, redis, proxy):
    await redis.script_load(SCRIPTS["ask"].source)  # else the dropped reply would be NOSCRIPT, run once
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await make_broker()
        async with first.agent("ci") as agent:
            waiting = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))  # a paused process, say
            pending = await next_pending(provider)
            second = await make_broker(url=proxy.url)
            async with second.agent("ci") as other:
                lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["ask"].sha)
                again = asyncio.ensure_future(other.ask(one_question("yes", "no"), key=KEY, timeout=30))
                assert await asyncio.to_thread(lost.wait, 10), "the re-attach's reply was never dropped"
                with pytest.raises(UserQuestionError) as replaced:
                    await asyncio.wait_for(waiting, 5)
                assert replaced.value.code == CALLER_NOT_LIVE
                await pending.answer(pick("no"))
                assert await asyncio.wait_for(again, 10) == pick("no")


# -- case 11: nothing of a keyed ask outlives its need by more than the result TTL ----------------------------------


async def test_11_a_collected_keyed_answer_leaves_no_durable_key_nor_away_member(make_broker, redis):
    holder = await make_broker(result_ttl=5.0)
    async with holder.provider("ui") as provider:
        pending = await detached(await make_broker(), provider, detach_grace=0.5)
        await pending.answer(pick("yes"))
        assert await asked_again(await make_broker(result_ttl=5.0)) == pick("yes")
    durable = holder.keys.durable("ci", KEY)
    await until(lambda: _gone(redis, durable), 3)
    assert await redis.zscore(holder.keys.away, pending.request_id) is None


async def test_11_the_away_set_lapses_without_the_maintenance_worker(make_broker, redis):
    holder = await make_broker(result_ttl=2.0)
    async with holder.provider("ui") as provider:
        pending = await detached(await make_broker(result_ttl=2.0), provider, detach_grace=0.5)
        assert await redis.zscore(holder.keys.away, pending.request_id) is not None
        left = await redis.pttl(holder.keys.away)
        assert 0 < left <= 2_500 + 500  # the grace, then the result TTL, and no worker ever ran


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


# -- everything at once --------------------------------------------------------------------------------------------


async def test_keyed_asks_with_housekeeping_failover_cancellation_and_a_lost_reply(make_broker, redis, proxy):
    """Keyed askers detach and restart (one re-attach's reply is lost) while housekeeping runs and the lease
    moves: every restarted asker gets its own answer once; 0 lost, 0 answered twice, 0 misrouted."""
    await redis.script_load(SCRIPTS["ask"].source)
    housekeeper = await make_broker()
    keys = [f"job-{i}" for i in range(6)]

    async def housekeeping() -> None:
        while True:
            await run_housekeeping(housekeeper)
            await asyncio.sleep(0.1)

    sweeping = asyncio.ensure_future(housekeeping())
    try:
        old = await make_broker(lease_ttl=1.0)
        answers: dict[str, Any] = {}
        async with old.provider("old") as provider:
            for key in keys:  # each first asker is cancelled (detached) and its process stops
                first = await make_broker(client_ttl=0.3)
                async with first.agent(key) as agent:
                    task = asyncio.ensure_future(agent.ask(one_question(key, "no"), key=key, detach_grace=1.0))
                    await next_pending(provider)
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                await first.aclose()
            restarted = [await make_broker(**({"url": proxy.url} if i == 0 else {})) for i in range(len(keys))]
            lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["ask"].sha)
            scopes = [broker.agent(key) for broker, key in zip(restarted, keys, strict=True)]
            agents = [await scope.__aenter__() for scope in scopes]
            tasks = {
                key: asyncio.ensure_future(agent.ask(one_question(key, "no"), key=key, detach_grace=1.0, timeout=40))
                for key, agent in zip(keys, agents, strict=True)
            }
            assert await asyncio.to_thread(lost.wait, 10)
            await asyncio.sleep(1.5)  # past every first asker's liveness and grace, housekeeping running
        new = await make_broker(lease_ttl=1.0)
        async with new.provider("new") as provider:
            for _ in keys:
                card = await next_pending(provider)
                assert not card.asker_away
                await card.answer(pick(card.request.questions[0].labels[0]))
            for key, task in tasks.items():
                answers[key] = await asyncio.wait_for(task, 10)
        for scope in reversed(scopes):
            await scope.__aexit__(None, None, None)
    finally:
        sweeping.cancel()
        await asyncio.gather(sweeping, return_exceptions=True)
    assert answers == {key: pick(key) for key in keys}  # none lost, none misrouted
    answered = [f["rid"] for _, f in await redis.xrange(housekeeper.keys.audit) if f["event"] == "answered"]
    assert len(answered) == len(set(answered)) == len(keys)  # none answered twice
