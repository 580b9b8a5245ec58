"""Keyed asks: a question that outlives its asking process (detach, re-attach, late answers).

Each broker here stands for one asking process (its own client id, inbox and liveness key);
the processes-level proof (kill -9 of a real `qbroker ask --key`) is in test_durable_processes.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from broker import PendingRequest, Provider, UserQuestionError
from broker.operating.housekeeping import digest_audit, end_away, reap_abandoned
from tests.helpers import code_of, ends_withdrawn, next_pending, one_question, pick, trail, until

KEY = "deploy-2.4.0"


async def audit_events(redis: Any, broker: Any, rid: str) -> list[str]:
    entries = [("", fields) for fields in await trail(redis, broker.keys)]
    return [fields["event"] for _, fields in entries if fields.get("rid") == rid]


@pytest.fixture
async def provider(make_broker: Callable[..., Any]) -> AsyncIterator[Provider]:
    broker = await make_broker()
    async with broker.provider("ui") as holding:
        yield holding


async def detached_ask(make_broker: Callable[..., Any], provider: Provider, **options: Any) -> PendingRequest:
    """A keyed ask from agent 'ci' in a process that then stops waiting (its task cancelled)."""
    first = await make_broker()
    async with first.agent("ci") as agent:
        asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, **options))
        pending = await next_pending(provider)
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
    await until(lambda: pending.asker_away)
    return pending


async def test_a_cancelled_keyed_ask_stays_pending_and_its_card_says_asker_away(make_broker, provider, redis):
    pending = await detached_ask(make_broker, provider)
    assert not pending.withdrawn.is_set()
    assert pending in provider.pending
    assert await redis.hget(provider.keys.request(pending.request_id), "state") == "pending"
    assert await redis.zscore(provider.keys.away, pending.request_id) is not None


async def test_a_new_instance_re_attaches_to_the_same_request_and_gets_the_answer(make_broker, provider, redis):
    pending = await detached_ask(make_broker, provider)
    restarted = await make_broker()
    async with restarted.agent("ci") as agent:
        asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
        await until(lambda: not pending.asker_away)  # a kind=back notice reached the provider
        await pending.answer(pick("yes"))
        answer = await asyncio.wait_for(asking, 10)
    assert answer == pick("yes")
    assert provider.pending == []  # one card all along: no second request was enqueued
    assert await audit_events(redis, restarted, pending.request_id) == ["asked", "away", "attached", "answered"]


async def test_an_answer_given_while_the_asker_is_away_is_delivered_on_re_attach(make_broker, provider):
    pending = await detached_ask(make_broker, provider)
    await pending.answer(pick("no"))
    restarted = await make_broker()
    async with restarted.agent("ci") as agent:
        assert await asyncio.wait_for(agent.ask(one_question("yes", "no"), key=KEY), 5) == pick("no")
        # collected: the same key now asks a new question
        asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
        again = await next_pending(provider)
        assert again.request_id != pending.request_id
        await again.answer(pick("yes"))
        assert await asyncio.wait_for(asking, 5) == pick("yes")


async def test_an_answer_kept_for_an_away_asker_outlives_the_result_ttl_for_the_grace(make_broker, redis):
    holder = await make_broker(result_ttl=1.0)
    async with holder.provider("ui") as provider:
        pending = await detached_ask(make_broker, provider, detach_grace=30.0)
        await pending.answer(pick("yes"))
    ttl = await redis.pttl(holder.keys.outcome(pending.request_id))
    assert ttl > 20_000  # the grace, not the 1 s result TTL


async def test_the_same_key_with_a_different_request_is_a_bad_request(make_broker, provider):
    await detached_ask(make_broker, provider)
    restarted = await make_broker()
    async with restarted.agent("ci") as agent:
        with pytest.raises(UserQuestionError) as raised:
            await asyncio.wait_for(agent.ask(one_question("ship", "hold"), key=KEY), 5)
    assert raised.value.code == "BAD_REQUEST"
    assert KEY in raised.value.message and "different request" in raised.value.message


async def test_another_agents_key_is_a_different_question(make_broker, provider):
    pending = await detached_ask(make_broker, provider)
    other = await make_broker()
    async with other.agent("reviewer") as agent:
        asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, coalesce=False))
        theirs = await next_pending(provider)
        assert theirs.request_id != pending.request_id and theirs.agent_id == "reviewer"
        await theirs.answer(pick("no"))
        assert await asyncio.wait_for(asking, 5) == pick("no")
    assert pending in provider.pending  # ci's question is untouched


async def test_the_re_attaching_instance_must_be_live_and_a_root(make_broker, provider):
    await detached_ask(make_broker, provider)
    restarted = await make_broker()
    assert await code_of(restarted.ask(one_question("yes", "no", agent="ci"), key=KEY)) == "CALLER_NOT_LIVE"
    async with restarted.agent("root") as root, restarted.agent("ci", owner=root) as child:
        assert await code_of(child.ask(one_question("yes", "no"), key=KEY)) == "DELEGATED_CALLER"
    newest = await make_broker()
    async with restarted.agent("ci") as superseded, newest.agent("ci", restart=True):  # a newer instance took the id
        assert await code_of(superseded.ask(one_question("yes", "no"), key=KEY)) == "CALLER_NOT_LIVE"


async def test_the_grace_lapsing_ends_the_request_as_expired_and_the_key_asks_anew(make_broker, provider, redis):
    pending = await detached_ask(make_broker, provider, detach_grace=1.5)
    housekeeper = await make_broker()
    assert await end_away(housekeeper) == []  # not yet (the grace is long enough for a loaded machine)
    await asyncio.sleep(1.6)
    assert await end_away(housekeeper) == [pending.request_id]
    await asyncio.wait_for(pending.withdrawn.wait(), 5)  # the card comes down
    assert (await audit_events(redis, housekeeper, pending.request_id))[-1] == "expired"
    restarted = await make_broker()
    async with restarted.agent("ci") as agent:
        asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
        fresh = await next_pending(provider)
        assert fresh.request_id != pending.request_id
        asking.cancel()


async def test_an_uncollected_answer_is_dropped_once_it_lapses_and_the_request_ends_once(make_broker, redis):
    holder = await make_broker(result_ttl=0.3)
    async with holder.provider("ui") as provider:
        pending = await detached_ask(make_broker, provider, detach_grace=0.3)
        await pending.answer(pick("yes"))
    await asyncio.sleep(0.5)
    housekeeper = await make_broker()
    await end_away(housekeeper)  # the outcome key may still be live: waits for it
    await asyncio.sleep(0.5)
    await end_away(housekeeper)
    events = await audit_events(redis, housekeeper, pending.request_id)
    assert events[-2:] == ["answered", "uncollected"]  # it ended answered; the drop is not a second end
    assert not await redis.exists(holder.keys.request(pending.request_id), holder.keys.outcome(pending.request_id))
    ends = await digest_audit(housekeeper)  # what the metrics and webhooks count
    assert ends is not None
    assert [e.outcome for e in ends if e.request_id == pending.request_id] == ["answered"]


async def test_a_timeout_or_an_abort_gives_a_keyed_question_up(make_broker, provider, redis):
    broker = await make_broker()
    async with broker.agent("ci") as agent:
        # 2 s: long enough for the card to be shown first on a loaded machine (0.5 s could lapse before it was)
        timing_out = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY, timeout=2))
        pending = await next_pending(provider)
        with pytest.raises(UserQuestionError) as raised:
            await asyncio.wait_for(timing_out, 5)
        assert raised.value.code == "ASK_TIMED_OUT"
        await asyncio.wait_for(pending.withdrawn.wait(), 5)
        abort = asyncio.Event()
        aborting = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key="other", abort=abort))
        pending = await next_pending(provider)
        abort.set()
        await ends_withdrawn(aborting, pending, "ASK_ABORTED")


async def test_closing_the_broker_detaches_a_keyed_ask(make_broker, provider):
    first = await make_broker()
    asking = asyncio.ensure_future(first.ask(one_question("yes", "no"), key=KEY))
    pending = await next_pending(provider)
    await first.aclose()
    assert await code_of(asking) == "BROKER_UNAVAILABLE"
    await until(lambda: pending.asker_away)
    restarted = await make_broker()
    asking = asyncio.ensure_future(restarted.ask(one_question("yes", "no"), key=KEY))
    await until(lambda: not pending.asker_away)
    await pending.answer(pick("yes"))
    assert await asyncio.wait_for(asking, 5) == pick("yes")


async def test_a_process_still_waiting_is_told_when_another_re_attaches(make_broker, provider):
    first, second = await make_broker(), await make_broker()
    waiting = asyncio.ensure_future(first.ask(one_question("yes", "no"), key=KEY))
    pending = await next_pending(provider)
    taking_over = asyncio.ensure_future(second.ask(one_question("yes", "no"), key=KEY))
    assert await code_of(waiting) == "CALLER_NOT_LIVE"
    await pending.answer(pick("no"))
    assert await asyncio.wait_for(taking_over, 5) == pick("no")


async def test_housekeeping_marks_a_dead_askers_keyed_request_away_not_withdrawn(make_broker, provider, redis):
    asker = await make_broker()
    asking = asyncio.ensure_future(asker.ask(one_question("yes", "no"), key=KEY))
    pending = await next_pending(provider)
    await redis.delete(asker.keys.client(asker.client_id))  # what a kill -9 leads to, once the TTL passes
    housekeeper = await make_broker()
    assert await reap_abandoned(housekeeper) == ([], 0)
    await until(lambda: pending.asker_away)
    assert not pending.withdrawn.is_set()
    await asker._core.inbox.beat()  # the process was only paused: it beats again
    await reap_abandoned(housekeeper)
    await until(lambda: not pending.asker_away)
    await pending.answer(pick("yes"))
    assert await asyncio.wait_for(asking, 10) == pick("yes")


async def test_the_same_key_twice_in_one_process_is_a_bad_request(make_broker, provider):
    broker = await make_broker()
    asking = asyncio.ensure_future(broker.ask(one_question("yes", "no"), key=KEY))
    await next_pending(provider)
    assert await code_of(broker.ask(one_question("yes", "no"), key=KEY)) == "BAD_REQUEST"
    asking.cancel()


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"key": ""}, "1-200 characters"),
        ({"key": "has space"}, "1-200 characters"),
        ({"key": "x" * 201}, "1-200 characters"),
        ({"key": 7}, "1-200 characters"),
        ({"key": "k", "detach_grace": -1}, "detach_grace"),
        ({"detach_grace": 5}, "keyed ask only"),
    ],
)
async def test_a_bad_key_or_grace_is_a_bad_request(make_broker, provider, options, fragment):
    broker = await make_broker()
    with pytest.raises(UserQuestionError) as raised:
        await asyncio.wait_for(broker.ask(one_question("yes"), **options), 5)
    assert raised.value.code == "BAD_REQUEST"
    assert fragment in raised.value.message


async def test_status_shows_away_askers_with_their_key_and_grace(make_broker, provider):
    from broker import namespace_status
    from workers.operating.status.view import format_status

    await detached_ask(make_broker, provider)
    status = await namespace_status(await make_broker())
    (info,) = status.pending
    assert info.key == KEY
    assert info.away_s is not None and info.grace_left_s is not None and 290 < info.grace_left_s <= 300
    text = format_status(status)
    assert "away askers   1" in text and f"(key {KEY})" in text


async def test_a_new_lease_holder_shows_an_away_askers_request_and_its_answer_reaches_the_re_attacher(
    make_broker,
):
    first_holder, second_holder = await make_broker(), await make_broker()
    async with first_holder.provider("ui-1") as provider:
        pending = await detached_ask(make_broker, provider)
    # the lease was released with the request unsettled: the standby takes it over
    async with second_holder.provider("ui-2") as takeover:
        shown = await next_pending(takeover)
        assert shown.request_id == pending.request_id and shown.asker_away
        restarted = await make_broker()
        async with restarted.agent("ci") as agent:
            asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
            await until(lambda: not shown.asker_away)
            await shown.answer(pick("yes"))
            assert await asyncio.wait_for(asking, 10) == pick("yes")
