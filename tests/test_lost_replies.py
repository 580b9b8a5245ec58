"""A blocking read's reply lost with its connection (through tests/faultproxy.py): recovered from durable state.

The proxy drops the reply that carried the data and resets the connection, then refuses
reconnections until the ask ends, so that the client sees its read break (however many times
its library retries the connection: redis-py's Retry gives up after about 5.5 s) and must catch
up from what Redis kept: the outcome key for the asker, the consumer group's pending list for
the provider. (A reconnection that succeeds at once, with the read re-sent silently, is issue 11
case 1: the lead's tests.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from broker import AskUserQuestionItem, AskUserQuestionRequest, Broker, PendingRequest, Provider
from broker._keys import TOMBSTONE_MS
from broker._lua import SCRIPTS
from broker.asking._inbox import _DRAIN
from tests.faultproxy import FaultProxy
from tests.helpers import next_pending, one_question, options, pick
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as running:
        yield running


@pytest.fixture
async def asks(make_broker: object) -> AsyncIterator[list[asyncio.Task[object]]]:
    """The test's ask tasks: cancelled and their ends retrieved before the brokers close.

    An ask's exception left unretrieved is logged from a finaliser; on Python 3.11.7 that
    traceback's ast.parse, run inside pytest's own ast.parse of a late import, raised
    "SystemError: AST constructor recursion depth mismatch" and an INTERNALERROR.
    """
    started: list[asyncio.Task[object]] = []
    yield started
    for task in started:
        task.cancel()
    await asyncio.wait(started, timeout=10)
    for task in started:
        if task.done() and not task.cancelled():
            task.exception()


async def test_a_notice_lost_with_a_broken_inbox_read_is_caught_up(proxy, make_broker, asks):
    asking = await make_broker(url=proxy.url, sweep_every=60.0)  # only the catch-up can recover it
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        task, pending = await shown_and_listening(asking, provider, proxy, asks)  # no timeout of its own
        lost = proxy.drop_next_reply(b"BLMPOP", skip_empty=True)
        proxy.refuse()  # open connections (the command connection) keep working
        try:
            await pending.answer(pick("yes"))
            assert await asyncio.to_thread(lost.wait, 5), "the notice's BLMPOP reply never came"
            # not wait_for: cancelling the ask withdraws it, finds it answered and returns the answer
            await asyncio.wait({task}, timeout=20)
            assert task.done(), "the ask still waits for a notice that was lost"
            assert task.result() == pick("yes")
        finally:
            proxy.heal()


async def test_a_catch_up_of_thousands_of_waiting_asks_gives_each_read_its_own_deadline(proxy, make_broker, asks):
    """After a broken inbox read the asker re-reads every awaited outcome, 1 000 to a read. Here 3 050
    wait and every round trip takes 1.4 s: each read is well inside one read's deadline (5 s), the whole
    catch-up is not. With one deadline for them all (as before issue 27, at 25 000 waiting on a busy
    machine) the catch-up was cut short again and again and the asks ended BROKER_UNAVAILABLE as if
    Redis were down; the answer below sits in the last read."""
    count = 3 * _DRAIN + 50
    asking = await make_broker(url=proxy.url, sweep_every=60.0)  # only the catch-up can recover it
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        by_text: dict[str, asyncio.Task[object]] = {}
        for n in range(count):
            text = f"Deploy build {n}?"
            request = AskUserQuestionRequest(
                questions=(AskUserQuestionItem(id="q1", question=text, options=options("yes", "no")),)
            )
            by_text[text] = asyncio.create_task(asking.ask(request, coalesce=False))
        asks.extend(by_text.values())
        for _ in range(count - 1):  # the provider takes them in the order asked: the last one asked comes last
            await next_pending(provider, timeout=30)
        last = await next_pending(provider, timeout=30)
        task = by_text[last.request.questions[0].question]
        assert not task.done()
        await seen(proxy, "BLMPOP")
        lost = proxy.drop_next_reply(b"BLMPOP", skip_empty=True)
        proxy.delay(0.7)  # from now on, each way: a round trip of the asker's takes 1.4 s
        try:
            await last.answer(pick("yes"))
            assert await asyncio.to_thread(lost.wait, 10), "the notice's BLMPOP reply never came"
            await asyncio.wait({task}, timeout=20)  # four reads of 1.4 s, then the answer
            assert task.done(), "the catch-up never reached the last read"
            assert task.result() == pick("yes")
        finally:
            proxy.heal()


async def test_an_entry_lost_with_a_broken_provider_read_is_claimed_from_the_pending_list(proxy, make_broker, asks):
    asking = await make_broker()
    answering = await make_broker(
        url=proxy.url, lease_ttl=60.0
    )  # no periodic reclaim in time: only the claim after the break
    async with answering.provider("ui") as provider:
        await seen(proxy, "XREADGROUP")  # its blocking connection is open before new ones are refused
        lost = proxy.drop_next_reply(b"XREADGROUP", skip_empty=True)
        proxy.refuse()
        try:
            task = asyncio.create_task(asking.ask(one_question(), timeout=40))
            asks.append(task)
            assert await asyncio.to_thread(lost.wait, 5), "the entry's XREADGROUP reply never came"
            pending = await next_pending(provider, timeout=20)
            await pending.answer(pick("no"))
            assert await asyncio.wait_for(task, 10) == pick("no")
        finally:
            proxy.heal()


async def seen(proxy: FaultProxy, command: str, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not proxy.seen(command):
            await asyncio.sleep(0.02)


async def shown_and_listening(
    asking: Broker, provider: Provider, proxy: FaultProxy, asks: list[asyncio.Task[object]]
) -> tuple[asyncio.Task[object], PendingRequest]:
    """An ask of ``asking`` (added to ``asks``) shown to ``provider``, once its asker's blocking read for the
    answer (BLMPOP) has gone through ``proxy``: the ask's task and the card."""
    task: asyncio.Task[object] = asyncio.create_task(asking.ask(one_question()))
    asks.append(task)
    pending = await next_pending(provider)
    await seen(proxy, "BLMPOP")
    return task, pending


async def test_a_settle_retried_after_the_asker_cleaned_up_is_recognised_as_done(proxy, make_broker, redis, asks):
    """docs/reliability.md: the asker removes a request's keys once its ask returned, leaving a slim 60 s
    tombstone for a provider's settle retry. Here the settle's reply is lost, the asker gets the answer
    and cleans up, and only then does the provider's retry get through: it must be recognised as
    its own settlement (not NOT_PENDING, which fails the answer), and re-create nothing."""
    asking = await make_broker()
    answering = await make_broker(url=proxy.url, lease_ttl=30.0)  # its lease outlives the outage below
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question(), timeout=40))
        asks.append(task)
        pending = await next_pending(provider)
        key = asking.keys.request(pending.request_id)
        await redis.script_load(SCRIPTS["settle"].source)  # the reply dropped is the script's, not a NOSCRIPT
        lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["settle"].sha)
        proxy.refuse()  # the retry waits until the asker has cleaned up
        try:
            answered = asyncio.create_task(pending.answer(pick("yes")))
            assert await asyncio.to_thread(lost.wait, 5), "the settle's reply never came"
            assert await asyncio.wait_for(task, 10) == pick("yes")
            async with asyncio.timeout(5):
                while "entry" in await redis.hgetall(key):  # the clean-up leaves the tombstone alone
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # a retry comes within about a second; the tombstone must outlive it
        finally:
            proxy.heal()
        assert await asyncio.wait_for(answered, 15) == pick("yes")
    assert await redis.hget(key, "state") == "answered"
    assert set(await redis.hgetall(key)) == {"state", "client", "settle_call", "by"}  # still the slim tombstone
    assert not await redis.exists(asking.keys.outcome(pending.request_id))  # nothing re-created for nobody
    assert 50_000 < await redis.pttl(key) <= TOMBSTONE_MS


async def test_a_vote_whose_reply_was_lost_counts_once(proxy, make_broker, redis, asks, tmp_path):
    """approve.lua's reply lost with its connection: the broker sends the vote again, which finds it
    recorded; one vote, one audit entry, and the quorum still needs the second person."""
    from broker import load_policies
    from tests.test_quorum import POLICY, deploy

    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    policies = load_policies(path)
    asking = await make_broker()
    answering = await make_broker(url=proxy.url, lease_ttl=30.0)
    async with answering.provider("web") as provider:
        task = asyncio.create_task(asking.ask(deploy(), timeout=40))
        asks.append(task)
        card = await next_pending(provider)
        await redis.script_load(SCRIPTS["approve"].source)  # the reply dropped is the script's, not a NOSCRIPT
        lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["approve"].sha)
        first = await asyncio.wait_for(policies.vote(card, pick("yes"), by="alice"), 15)
        assert lost.is_set(), "the vote's reply was never dropped"
        assert first is not None and first.decided is None and first.approved_by == ("alice",)
        assert not task.done()
        done = await asyncio.wait_for(policies.vote(card, pick("yes"), by="bob"), 15)
        assert done is not None and done.by == ("alice", "bob")
        assert await asyncio.wait_for(task, 10) == pick("yes")
    votes = [f for _, f in await redis.xrange(asking.keys.audit) if f.get("event") == "vote"]
    assert [v["by"] for v in votes] == ["alice", "bob"]
