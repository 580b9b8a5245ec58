"""Keyed asks (issue 14) under faults on the wire (tests/faultproxy.py): a lost reply of the
scripts that ask, re-attach and detach, and a silent connection. Each script is safe to run
twice, and a keyed question outlives an outage of its asker's connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from broker import Broker, UserQuestionError
from broker._lua import SCRIPTS
from broker.errors import BROKER_UNAVAILABLE
from tests.faultproxy import FaultProxy
from tests.helpers import next_pending, one_question, pick, until
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)

KEY = "release-7"


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as running:
        yield running


async def cached(redis: Redis, *names: str) -> None:
    """Load the scripts first: else a dropped reply would be NOSCRIPT and the script would run only once."""
    for name in names:
        await redis.script_load(SCRIPTS[name].source)


async def asked_events(redis: Redis, broker: Broker) -> list[dict[str, str]]:
    return [fields for _, fields in await redis.xrange(broker.keys.asklog) if fields["event"] == "asked"]


async def test_a_keyed_ask_whose_reply_was_lost_is_asked_once(proxy, make_broker, redis):
    await cached(redis, "ask")
    asking, answering = await make_broker(url=proxy.url), await make_broker()
    async with answering.provider("ui") as provider, asking.agent("ci") as agent:
        lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["ask"].sha)
        task = asyncio.ensure_future(agent.ask(one_question(), key=KEY, timeout=30))
        assert await asyncio.to_thread(lost.wait, 10), "ask.lua's reply was never dropped"
        pending = await next_pending(provider, 15)
        await pending.answer(pick("yes"))
        assert await asyncio.wait_for(task, 15) == pick("yes")
        assert provider.pending == []
    assert len(await asked_events(redis, asking)) == 1  # the retry enqueued nothing


async def test_a_re_attach_whose_reply_was_lost_still_gets_the_answer(proxy, make_broker, redis):
    await cached(redis, "ask")
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        first = await make_broker()
        async with first.agent("ci") as agent:
            gone = asyncio.ensure_future(agent.ask(one_question(), key=KEY))
            pending = await next_pending(provider)
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
        await until(lambda: pending.asker_away)
        restarted = await make_broker(url=proxy.url)
        async with restarted.agent("ci") as agent:
            lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["ask"].sha)
            again = asyncio.ensure_future(agent.ask(one_question(), key=KEY, timeout=30))
            assert await asyncio.to_thread(lost.wait, 10), "the re-attach's reply was never dropped"
            await until(lambda: not pending.asker_away)
            assert provider.pending == [pending]  # the same card, not a second one
            await pending.answer(pick("no"))
            assert await asyncio.wait_for(again, 15) == pick("no")
    assert len(await asked_events(redis, restarted)) == 1


async def test_a_detach_whose_reply_was_lost_keeps_the_question_for_the_restart(proxy, make_broker, redis):
    await cached(redis, "detach")
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        first = await make_broker(url=proxy.url)
        async with first.agent("ci") as agent:
            task = asyncio.ensure_future(agent.ask(one_question(), key=KEY))
            pending = await next_pending(provider)
            lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["detach"].sha)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert await asyncio.to_thread(lost.wait, 10), "detach.lua's reply was never dropped"
        await until(lambda: pending.asker_away)
        assert not pending.withdrawn.is_set()
        await pending.answer(pick("yes"))  # answered while its asker is away
        restarted = await make_broker()
        async with restarted.agent("ci") as agent:
            assert await asyncio.wait_for(agent.ask(one_question(), key=KEY), 10) == pick("yes")


async def test_a_silent_connection_ends_a_keyed_ask_in_time_and_its_question_waits_for_the_restart(
    proxy, make_broker, redis
):
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        asking = await make_broker(url=proxy.url, unavailable_after=1.5)
        async with asking.agent("ci") as agent:
            task = asyncio.ensure_future(agent.ask(one_question(), key=KEY))
            pending = await next_pending(provider)
            proxy.silence()
            with pytest.raises(UserQuestionError) as raised:
                await asyncio.wait_for(task, 15)
            assert raised.value.code == BROKER_UNAVAILABLE
            proxy.heal()
            # an outage detaches a keyed ask rather than withdrawing it: the human may still answer
            await until(lambda: pending.asker_away, 20)
        assert not pending.withdrawn.is_set()
        restarted = await make_broker()
        async with restarted.agent("ci") as agent:
            again = asyncio.ensure_future(agent.ask(one_question(), key=KEY, timeout=30))
            await until(lambda: not pending.asker_away)
            await pending.answer(pick("no"))
            assert await asyncio.wait_for(again, 10) == pick("no")
