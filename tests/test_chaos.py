"""Redis restarted, gone for good, or a connection killed: nothing lost, nothing hangs."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from broker import Broker, UserQuestionError
from tests.helpers import KEYS, code_of, next_pending, one_question, pick

pytestmark = pytest.mark.slow


async def open_broker(url: str, **options: object) -> Broker:
    broker = Broker(url, "chaos", **options, **KEYS)  # type: ignore[arg-type]
    await broker.__aenter__()
    return broker


@pytest.mark.parametrize("how", ["restart", "kill-9"])
async def test_pending_questions_survive_a_redis_restart_with_aof(redis_factory, how):
    server = redis_factory("--appendonly", "yes", "--appendfsync", "everysec")
    asking, answering = await open_broker(server.url), await open_broker(server.url)
    try:
        async with answering.provider("ui", standby=True) as provider:
            asks = [asyncio.create_task(asking.ask(one_question(), timeout=60)) for _ in range(5)]
            for _ in range(5):
                await next_pending(provider)
            if how == "kill-9":
                await asyncio.sleep(1.5)  # appendfsync everysec: what is a second old is on disk
                server.kill()
            else:
                await asyncio.to_thread(server.process.terminate)
                await asyncio.to_thread(server.process.wait)
            server.start()
            # the provider reconnects, claims its backlog again and answers every question once
            for pending in list(provider.pending):
                await pending.answer(pick("yes"))
            assert await asyncio.gather(*asks) == [pick("yes")] * 5
    finally:
        await asking.aclose()
        await answering.aclose()


async def test_a_keyed_question_whose_asker_is_away_survives_a_redis_kill_with_aof(redis_factory):
    server = redis_factory("--appendonly", "yes", "--appendfsync", "everysec")
    first, answering = await open_broker(server.url), await open_broker(server.url)
    try:
        async with answering.provider("ui", standby=True) as provider:
            asking = asyncio.create_task(first.ask(one_question("yes", "no"), key="release"))
            pending = await next_pending(provider)
            await first.aclose()  # detached: its asker is away
            with pytest.raises(UserQuestionError):
                await asking
            await asyncio.sleep(1.5)  # appendfsync everysec: what is a second old is on disk
            server.kill()
            server.start()
            restarted = await open_broker(server.url)
            try:
                again = asyncio.create_task(restarted.ask(one_question("yes", "no"), key="release"))
                async with asyncio.timeout(20):  # re-attached to the same request: no second card
                    while pending.asker_away or not provider.pending:
                        await asyncio.sleep(0.05)
                assert [p.request_id for p in provider.pending] == [pending.request_id]
                await provider.pending[0].answer(pick("no"))
                assert await asyncio.wait_for(again, 20) == pick("no")
            finally:
                await restarted.aclose()
    finally:
        await first.aclose()
        await answering.aclose()


async def test_asks_fail_with_a_clear_code_when_redis_is_gone_for_good(redis_factory):
    server = redis_factory()
    asking = await open_broker(server.url, unavailable_after=1.0)
    answering = await open_broker(server.url)
    try:
        async with answering.provider("ui") as provider:
            waiting = asyncio.create_task(asking.ask(one_question()))  # no timeout of its own
            await next_pending(provider)
            server.kill()
            started = time.monotonic()
            assert await code_of(waiting) == "BROKER_UNAVAILABLE"
            assert await code_of(asking.ask(one_question())) == "BROKER_UNAVAILABLE"
            assert time.monotonic() - started < 30
    except* UserQuestionError:
        pass  # leaving the provider block cannot release a lease on a dead server
    finally:
        await asking.aclose()
        await answering.aclose()


async def test_a_killed_waiter_connection_loses_no_answer(make_broker, redis: Redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        asks = [asyncio.create_task(asking.ask(one_question())) for _ in range(3)]
        pendings = [await next_pending(provider) for _ in range(3)]
        await pendings[0].answer(pick("yes"))
        assert await asks[0] == pick("yes")
        # a notice lost with a broken connection: the waiter must catch up from the durable outcome
        await pendings[1].answer(pick("no"))
        await redis.delete(asking.keys.inbox(asking.client_id))
        killed = 0
        for client in await redis.client_list():
            if client.get("name") == f"qb-{asking.client_id}" and client.get("cmd") == "blmpop":
                killed += await redis.client_kill_filter(_id=client["id"])
        assert killed == 1  # the waiter's blocked read, and only it
        assert await asyncio.wait_for(asks[1], 10) == pick("no")
        await pendings[2].answer(pick("yes"))
        assert await asyncio.wait_for(asks[2], 10) == pick("yes")
