"""Issue 11's network cases reproduced through tests/faultproxy.py: each ask must end within a bound.

Each failed before the client rewrite (its docstring says how); now each passes. Unlike tests/test_lost_replies.py, the proxy here lets the client
reconnect at once, which is what makes redis-py's silent re-send of a blocking read lose data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from broker import UserQuestionError
from broker._lua import SCRIPTS
from broker.errors import BROKER_UNAVAILABLE
from tests.faultproxy import FaultProxy
from tests.helpers import next_pending, one_question, pick
from tests.redis_server import RedisServer
from tests.test_lost_replies import asks, seen, shown_and_listening

__all__ = ["asks"]  # the fixture the tests use

pytestmark = pytest.mark.timeout(60)
BOUND = 15.0  # seconds for an ask to end after its cause, in these tests


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as running:
        yield running


async def ends_within(task: asyncio.Task[object], bound: float = BOUND) -> object:
    """The ask's result or coded error; fails if it is still waiting after ``bound``."""
    await asyncio.wait({task}, timeout=bound)  # not wait_for: a cancelled ask may still return its answer
    if not task.done():
        pytest.fail(f"the ask still waits {bound:.0f}s after its cause")
    try:
        return task.result()
    except UserQuestionError as error:
        return error.code


async def test_a_notice_lost_with_its_connection_ends_the_ask_after_an_immediate_reconnect(proxy, make_broker, asks):
    asking, answering = await make_broker(url=proxy.url, sweep_every=60.0), await make_broker()
    async with answering.provider("ui") as provider:
        task, pending = await shown_and_listening(asking, provider, proxy, asks)
        lost = proxy.drop_next_reply(b"BLMPOP", skip_empty=True)
        await pending.answer(pick("yes"))
        assert await asyncio.to_thread(lost.wait, 5)
        assert await ends_within(task) == pick("yes")


async def test_an_entry_lost_with_its_connection_is_shown_after_an_immediate_reconnect(proxy, make_broker, asks):
    asking, answering = await make_broker(), await make_broker(url=proxy.url, lease_ttl=60.0)
    async with answering.provider("ui") as provider:
        await seen(proxy, "XREADGROUP")
        lost = proxy.drop_next_reply(b"XREADGROUP", skip_empty=True)
        task = asyncio.create_task(asking.ask(one_question()))
        asks.append(task)
        assert await asyncio.to_thread(lost.wait, 5)
        pending = await next_pending(provider, timeout=BOUND)
        await pending.answer(pick("no"))
        assert await ends_within(task) == pick("no")


async def test_an_ask_behind_a_silent_connection_ends_within_the_bound(proxy, make_broker, asks):
    asking, answering = await make_broker(url=proxy.url, unavailable_after=5.0), await make_broker()
    async with answering.provider("ui") as provider:
        task, pending = await shown_and_listening(asking, provider, proxy, asks)
        proxy.silence()
        try:
            await pending.answer(pick("yes"))  # answered, but the asker cannot hear it
            assert await ends_within(task) in (pick("yes"), "BROKER_UNAVAILABLE")
        finally:
            proxy.heal()


async def test_an_error_while_taking_a_read_does_not_strand_the_cards_it_registered(proxy, make_broker, redis, asks):
    """Issue 23 case 8: a card was listed in ``pending`` when placed but scheduled only after the read's
    notices were acked; an error from ``notice_ack`` in between stranded it (listed, never handed
    out, its asker waiting), and the claim after the error skipped its entry as already shown."""
    asking = await make_broker()
    keys = asking.keys
    await redis.set(keys.provider, "1:0123456789abcdef:stalled", px=60_000)  # a holder that reads nothing
    kept = asyncio.create_task(asking.ask(one_question(), timeout=40))
    asks.append(kept)
    async with asyncio.timeout(5):
        while not await redis.xlen(keys.requests):
            await asyncio.sleep(0.02)
    # A withdraw notice (of a request the stalled holder had shown) after it: the next holder's first
    # read takes an ask and a notice together.
    await redis.xadd(keys.requests, {"kind": "withdraw", "rid": "r-shown-before", "reason": "withdrawn"})
    await redis.delete(keys.provider)  # its lease lapsed
    failed = proxy.fail_next_reply(b"EVALSHA", SCRIPTS["notice_ack"].sha)
    answering = await make_broker(url=proxy.url)
    async with answering.provider("ui") as provider:
        # Already waiting when the read fails: the read's new card must wake it all the same.
        waiting = asyncio.ensure_future(next_pending(provider, timeout=10))
        assert await asyncio.to_thread(failed.wait, 5), "notice_ack was never called"
        shown = await waiting
        await shown.answer(pick("yes"))
        assert await asyncio.wait_for(kept, 10) == pick("yes")
        assert provider.pending == []


@pytest.mark.timeout(40)
async def test_an_answer_on_its_way_when_the_provider_stops_gets_a_coded_error_not_a_cancellation(
    make_broker, redis_server
):
    """The provider's block ends while Redis is silent: settling gives up after a lease TTL, and the caller of
    ``answer`` (a web handler, say) is told ``BROKER_UNAVAILABLE`` (it may or may not have applied), never
    cancelled in a task nobody cancelled (the client rule: a background task's failure never cancels its caller)."""
    with FaultProxy(redis_server.port) as proxy:
        asker = await make_broker()
        answerer = await make_broker(url=proxy.url, lease_ttl=1.0)
        async with answerer.provider("ui") as provider:
            asked = asyncio.ensure_future(asker.ask(one_question(), timeout=30))
            card = await next_pending(provider)
            proxy.silence()
            answering = asyncio.ensure_future(card.answer(pick("yes"), by="alice"))
            await asyncio.sleep(0.3)  # its settlement queued and on its way into the silence
        with pytest.raises(UserQuestionError) as caught:
            await asyncio.wait_for(answering, 20)
        assert caught.value.code == BROKER_UNAVAILABLE and not answering.cancelled()
        proxy.heal()
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)
