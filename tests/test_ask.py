"""ask(): the seeds' check order, every way out of a wait, and the outcome encoding."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from broker import AskUserQuestionRequest, Broker, PlanReviewIntent, UserQuestionError
from broker._lua import SCRIPTS
from tests.helpers import (
    KEYS,
    answer,
    cancelled_withdraws,
    code_of,
    ends_withdrawn,
    next_pending,
    one_question,
    pick,
    plan_review,
    question,
    trail,
)

# -- the check order -----------------------------------------------------------------------


async def test_an_already_set_abort_wins_over_everything(make_broker):
    broker = await make_broker()
    abort = asyncio.Event()
    abort.set()
    empty = AskUserQuestionRequest(questions=(), agent="nobody")
    assert await code_of(broker.ask(empty, abort=abort)) == "ASK_ABORTED"


async def test_empty_questions_come_before_the_caller_gate(make_broker):
    broker = await make_broker()
    assert await code_of(broker.ask(AskUserQuestionRequest(questions=(), agent="nobody"))) == "EMPTY_QUESTIONS"


async def test_an_unknown_agent_is_not_live(make_broker, answering):
    broker = await make_broker()
    assert await code_of(broker.ask(one_question(agent="ghost"))) == "CALLER_NOT_LIVE"


async def test_guessing_a_live_agents_id_does_not_let_another_process_ask_as_it(make_broker, answering):
    owner_process = await make_broker()
    other_process = await make_broker()
    async with owner_process.agent("root"):
        assert await code_of(other_process.ask(one_question(agent="root"))) == "CALLER_NOT_LIVE"


async def test_a_restarted_instance_of_the_same_id_makes_the_older_not_live(make_broker, answering):
    first_process, second_process = await make_broker(), await make_broker()
    async with first_process.agent("root") as old, second_process.agent("root", restart=True):
        assert await code_of(old.ask(one_question())) == "CALLER_NOT_LIVE"


async def test_an_expired_agent_record_is_put_back_by_its_live_process_not_by_a_superseded_one(
    make_broker, answering, redis
):
    """The record decides at the gate; a process that is live (its heartbeats go on) puts a lapsed record back, as
    its next heartbeat would, and asks; one a restart of the id superseded is refused (test_agents: Redis restarted
    without its data)."""
    broker, restarted = await make_broker(), await make_broker()
    async with broker.agent("root") as agent:
        await redis.delete(broker.keys.agent("root"))  # what expiry does
        task = asyncio.create_task(agent.ask(one_question("yes", "no")))
        await (await next_pending(answering)).answer(pick("yes"))
        assert await task == pick("yes") and await redis.exists(broker.keys.agent("root")) == 1
        async with restarted.agent("root", restart=True):
            assert await code_of(agent.ask(one_question())) == "CALLER_NOT_LIVE"
            assert agent.superseded


async def test_an_owned_agent_is_a_delegated_caller(make_broker, answering):
    broker = await make_broker()
    async with broker.agent("parent") as parent, broker.agent("child", owner=parent) as child:
        with pytest.raises(UserQuestionError) as raised:
            await child.ask(one_question())
    assert raised.value.code == "DELEGATED_CALLER"
    assert "final result" in raised.value.message


async def test_an_agent_registered_without_owner_is_a_root_whatever_its_history(make_broker, answering):
    broker = await make_broker()
    async with broker.agent("parent") as parent, broker.agent("resumed", owner=parent):
        pass
    async with broker.agent("resumed") as resumed:  # resumed as a new runtime root
        task = asyncio.create_task(resumed.ask(one_question()))
        pending = await next_pending(answering)
        assert pending.agent_id == "resumed"
        await pending.answer(pick("yes"))
        assert await task == pick("yes")


async def test_the_caller_gate_comes_before_intent_and_structure_checks(make_broker, answering):
    broker = await make_broker()
    bad = AskUserQuestionRequest(questions=(question("a", "x", intent=PlanReviewIntent(approve="nope")),))
    async with broker.agent("parent") as parent, broker.agent("child", owner=parent) as child:
        assert await code_of(child.ask(bad)) == "DELEGATED_CALLER"
    assert await code_of(broker.ask(bad)) == "BAD_INTENT"


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        pytest.param(plan_review("Go"), "BAD_INTENT", id="approve-names-no-option"),
        pytest.param(
            AskUserQuestionRequest(questions=(question("a", "A", intent=PlanReviewIntent(approve="A")),)),
            "BAD_INTENT",
            id="intent-without-detail",
        ),
        pytest.param(
            AskUserQuestionRequest(questions=(question("a"), question("a"))), "BAD_REQUEST", id="duplicate-id"
        ),
        pytest.param(one_question("x", "x"), "BAD_REQUEST", id="duplicate-label"),
    ],
)
async def test_bad_requests_never_reach_redis(make_broker, redis, request_, code):
    broker = await make_broker()  # no provider at all: NO_PROVIDER would come from Redis
    assert await code_of(broker.ask(request_)) == code
    assert await redis.xlen(broker.keys.requests) == 0


async def test_no_provider_is_the_end_of_the_chain(make_broker):
    broker = await make_broker()
    assert await code_of(broker.ask(one_question())) == "NO_PROVIDER"


async def test_with_only_a_standby_the_request_waits_in_the_stream(make_broker, redis):
    holder, standby_broker, asking = [await make_broker(lease_ttl=1.0) for _ in range(3)]
    standing = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:

        async def stand_by() -> None:
            async with standby_broker.provider("b", on_standby=lambda _: standing.set()) as provider:
                pending = await next_pending(provider, 10)
                await pending.answer(pick("no"))

        async with holder.provider("a") as stalled:
            waiting = tasks.create_task(stand_by())
            await asyncio.wait_for(standing.wait(), 5)
            await redis.delete(holder.keys.provider)  # the holder's lease lapsed (it stalled)
            assert await asking.ask(one_question(), timeout=10) == pick("no")
            await waiting
            assert stalled.lost


# -- waiting and its ways out ---------------------------------------------------------------


async def test_a_batch_is_answered_in_question_order(make_broker, answering):
    broker = await make_broker()
    batch = AskUserQuestionRequest(questions=(question("a", "x", "y"), question("b", "p", "q", multi=True)))
    task = asyncio.create_task(broker.ask(batch))
    pending = await next_pending(answering)
    accepted = await pending.answer(answer(("b", ("q", "p"), "and more"), ("a", (), "other")))
    expected = answer(("a", (), "other"), ("b", ("q", "p"), "and more"))
    assert accepted == expected
    assert await task == expected


async def test_a_plan_review_answer_is_encoded_as_without_intent(make_broker, answering):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(plan_review()))
    pending = await next_pending(answering)
    await pending.answer(pick("Approve", "plan"))
    assert await task == pick("Approve", "plan")


async def test_a_bad_answer_is_refused_and_the_question_stays_pending(make_broker, answering):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question()))
    pending = await next_pending(answering)
    assert await code_of(pending.answer(pick("maybe"))) == "BAD_ANSWER"
    assert not task.done()
    await pending.answer(pick("no"))
    assert await task == pick("no")


async def test_the_first_answer_wins_and_later_ones_are_not_pending(make_broker, answering):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question()))
    pending = await next_pending(answering)
    await pending.answer(pick("yes"))
    assert await code_of(pending.answer(pick("no"))) == "NOT_PENDING"
    assert await code_of(pending.cancel()) == "NOT_PENDING"
    assert await task == pick("yes")


async def test_a_dismissed_question_is_ask_cancelled(make_broker, answering):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question()))
    pending = await next_pending(answering)
    await pending.cancel("not now")
    assert await code_of(task) == "ASK_CANCELLED"


async def test_a_timeout_is_ask_timed_out_and_withdraws(make_broker, answering, redis):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question(), timeout=0.5))
    pending = await next_pending(answering)
    await ends_withdrawn(task, pending, "ASK_TIMED_OUT")
    assert await code_of(pending.answer(pick("yes"))) == "NOT_PENDING"
    assert await redis.exists(broker.keys.request(pending.request_id)) == 0


async def test_an_abort_while_waiting_is_ask_aborted_and_withdraws(make_broker, answering):
    broker = await make_broker()
    abort = asyncio.Event()
    task = asyncio.create_task(broker.ask(one_question(), abort=abort))
    pending = await next_pending(answering)
    abort.set()
    await ends_withdrawn(task, pending, "ASK_ABORTED")


async def test_cancelling_the_asking_task_withdraws(make_broker, answering):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question()))
    pending = await next_pending(answering)
    await cancelled_withdraws(task, pending)
    assert await code_of(pending.answer(pick("yes"))) == "NOT_PENDING"


async def test_a_domain_error_wins_over_a_simultaneous_abort(make_broker, answering):
    broker = await make_broker()
    abort = asyncio.Event()
    task = asyncio.create_task(broker.ask(one_question(), abort=abort))
    pending = await next_pending(answering)
    await pending.cancel("dismissed")
    abort.set()  # before the asker has seen the outcome
    assert await code_of(task) == "ASK_CANCELLED"


async def test_an_answer_settled_before_a_timeout_is_returned(make_broker, answering):
    broker = await make_broker()
    abort = asyncio.Event()
    task = asyncio.create_task(broker.ask(one_question(), abort=abort, timeout=30))
    pending = await next_pending(answering)
    await pending.answer(pick("yes"))
    abort.set()  # the answer was the first terminal transition
    assert await asyncio.wait_for(task, 5) == pick("yes")


# -- a timeout without answerers or abort signal (Ask.remote_until: no second task) ---------


async def test_a_timeout_withdraws_as_timed_out_in_the_audit(make_broker, answering, redis):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question(), timeout=0.3))
    pending = await next_pending(answering)
    assert await code_of(task) == "ASK_TIMED_OUT"
    events = [f for f in await trail(redis, broker.keys) if f.get("rid") == pending.request_id]
    assert [e["event"] for e in events] == ["asked", "timed_out"]


async def test_cancelling_an_ask_with_a_timeout_withdraws_and_stays_a_cancellation(make_broker, answering, redis):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question(), timeout=30))
    pending = await next_pending(answering)
    await cancelled_withdraws(task, pending)
    events = [f for f in await trail(redis, broker.keys) if f.get("rid") == pending.request_id]
    assert [e["event"] for e in events] == ["asked", "withdrawn"]


async def test_a_timed_out_ask_leaves_the_callers_own_timeout_working(make_broker, answering):
    broker = await make_broker()

    async def caller() -> str:
        async with asyncio.timeout(5):  # the caller's scope outlives the ask's timeout
            code = await code_of(broker.ask(one_question(), timeout=0.2))
            await asyncio.sleep(0.05)  # not cancelled by a leftover request of the ask's timer
            return code

    assert await caller() == "ASK_TIMED_OUT"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_an_answer_in_time_with_a_timeout_is_returned_and_nothing_is_left_armed(make_broker, answering):
    broker = await make_broker()
    task = asyncio.create_task(broker.ask(one_question(), timeout=0.5))
    await (await next_pending(answering)).answer(pick("yes"))
    assert await asyncio.wait_for(task, 5) == pick("yes")
    await asyncio.sleep(0.6)  # past the deadline: the timer was disarmed


async def test_the_asks_of_one_tick_go_in_one_ask_script_call_each_judged_alone(redis_factory):
    """ask.lua takes the asks queued for one pipeline in one call (broker._commands); each still
    gets its own verdict: here two accepted, one refused as a delegated caller."""
    server = redis_factory()
    redis = Redis.from_url(server.url, decode_responses=True)
    try:
        async with Broker(server.url, "merged", agent_ttl=60, **KEYS) as broker:
            await redis.zadd(broker.keys.standbys, {"t:standby": 2**52})  # asks are accepted while one stands by
            async with broker.agent("root") as root, broker.agent("child", owner=root) as child:
                await redis.script_load(SCRIPTS["ask"].source)  # else the first call is NOSCRIPT, then sent again
                await redis.config_resetstat()
                asks = [asyncio.ensure_future(a.ask(one_question(), timeout=30)) for a in (root, child, root)]
                assert await code_of(asks[1]) == "DELEGATED_CALLER"
                stats = await redis.info("commandstats")
                assert stats["cmdstat_evalsha"]["calls"] == 1
                entries = await redis.xrange(broker.keys.requests)
                assert len(entries) == 2 and entries[0][1]["rid"] != entries[1][1]["rid"]
                assert {fields["agent"] for _, fields in entries} == {"root"}
                for ask in (asks[0], asks[2]):
                    ask.cancel()
                await asyncio.gather(asks[0], asks[2], return_exceptions=True)
                assert await redis.xlen(broker.keys.requests) == 0  # both withdrawn
    finally:
        await redis.aclose()
