"""Housekeeping against a real redis-server: reaping, deadlines, trimming, run claims."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker import UserQuestionError
from broker._keys import Keys
from broker.operating.housekeeping import (
    claim_run,
    dead_letter_count,
    digest_audit,
    drop_stale_standbys,
    expire_overdue,
    pending_requests,
    reap_abandoned,
    run_housekeeping,
    trim_audit,
)
from tests.helpers import cancelled_withdraws, one_question, pick


async def _audit(redis: Any, keys: Keys, event: str) -> list[dict[str, str]]:
    return [f for _, f in await redis.xrange(keys.audit) if f.get("event") == event]


async def _next(provider: Any) -> Any:
    return await asyncio.wait_for(anext(aiter(provider)), 5)


async def _asked(asker: Any, provider: Any, **options: Any) -> tuple[asyncio.Task[Any], Any]:
    """An ask of ``asker`` (a broker or an agent) shown to ``provider``: its task, and the card."""
    task = asyncio.create_task(asker.ask(one_question(), **options))
    return task, await _next(provider)


async def test_agent_gone_request_is_withdrawn_and_asker_told(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    keys = asking.keys
    async with answering.provider("p1") as provider, asking.agent("a1") as agent:
        task, shown = await _asked(agent, provider)
        await redis.delete(keys.agent("a1"))  # the record expired

        withdrawn, _ = await reap_abandoned(answering)

        assert withdrawn == [shown.request_id]
        with pytest.raises(UserQuestionError) as caught:
            await asyncio.wait_for(task, 5)
        assert caught.value.code == "CALLER_NOT_LIVE"
        await asyncio.wait_for(shown.withdrawn.wait(), 5)  # the UI takes the card down
        with pytest.raises(UserQuestionError) as late:
            await shown.answer(pick("yes"))
        assert late.value.code == "NOT_PENDING"
    [event] = await _audit(redis, keys, "withdrawn")
    assert event["rid"] == shown.request_id
    assert event["reason"] == "the asking agent is no longer live"
    assert event["by"] == "housekeeping"


async def test_stopped_process_request_is_withdrawn_and_a_paused_one_still_told(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    keys = asking.keys
    async with answering.provider("p1") as provider:
        task, shown = await _asked(asking, provider)
        # The process stopped heart-beating (dead, or paused past its liveness TTL).
        await redis.delete(keys.client(asking.client_id))

        withdrawn, _ = await reap_abandoned(answering)

        assert withdrawn == [shown.request_id]
        await asyncio.wait_for(shown.withdrawn.wait(), 5)
        with pytest.raises(UserQuestionError) as caught:  # a paused process, waking, is not left waiting
            await asyncio.wait_for(task, 5)
        assert caught.value.code == "CALLER_NOT_LIVE"
    [event] = await _audit(redis, keys, "withdrawn")
    assert event["reason"] == "the asking process stopped"


async def test_live_requests_are_left_alone_and_reaping_is_idempotent(make_broker, redis):
    asking, stopped, answering = await make_broker(), await make_broker(), await make_broker()
    async with answering.provider("p1") as provider, asking.agent("a1") as agent:
        live, shown_live = await _asked(agent, provider)
        gone, shown_gone = await _asked(stopped, provider, coalesce=False)
        await redis.delete(stopped.keys.client(stopped.client_id))

        first, _ = await reap_abandoned(answering)
        second, _ = await reap_abandoned(answering)

        assert first == [shown_gone.request_id]
        assert second == []
        await shown_live.answer(pick("no"))
        assert await asyncio.wait_for(live, 5) == pick("no")
        with pytest.raises(UserQuestionError, match="CALLER_NOT_LIVE"):
            await asyncio.wait_for(gone, 5)
    assert len(await _audit(redis, asking.keys, "withdrawn")) == 1


async def test_deadline_passes_asker_gets_timed_out(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    keys = asking.keys
    async with answering.provider("p1") as provider:
        overdue, shown_overdue = await _asked(asking, provider)
        later, shown_later = await _asked(asking, provider)
        timeless, shown_timeless = await _asked(asking, provider)
        # Broker.ask() has no way to set a deadline yet; set the field ask.lua stores.
        now_s, now_us = await redis.time()
        now_ms = now_s * 1000 + now_us // 1000
        await redis.hset(keys.request(shown_overdue.request_id), "deadline", now_ms - 1)
        await redis.hset(keys.request(shown_later.request_id), "deadline", now_ms + 600_000)

        expired = await expire_overdue(answering)

        assert expired == [shown_overdue.request_id]
        with pytest.raises(UserQuestionError) as caught:
            await asyncio.wait_for(overdue, 5)
        assert caught.value.code == "ASK_TIMED_OUT"
        await asyncio.wait_for(shown_overdue.withdrawn.wait(), 5)
        assert await expire_overdue(answering) == []
        await shown_later.answer(pick("yes"))
        await shown_timeless.answer(pick("no"))
        assert await asyncio.wait_for(later, 5) == pick("yes")
        assert await asyncio.wait_for(timeless, 5) == pick("no")
    [event] = await _audit(redis, keys, "expired")
    assert event["rid"] == shown_overdue.request_id


async def test_expiry_loses_to_an_earlier_answer(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("p1") as provider:
        task, shown = await _asked(asking, provider)
        await redis.hset(asking.keys.request(shown.request_id), "deadline", 1)
        await shown.answer(pick("yes"))
        assert await expire_overdue(answering) == []
        assert await asyncio.wait_for(task, 5) == pick("yes")


async def test_stale_entries_are_removed(make_broker, redis):
    broker = await make_broker()
    keys = broker.keys
    await redis.xadd(keys.requests, {"kind": "ask", "rid": "nosuch", "client": "c", "agent": ""})
    withdrawn, stale = await reap_abandoned(broker)
    assert (withdrawn, stale) == ([], 1)
    assert await redis.xlen(keys.requests) == 0


async def test_pending_requests_lists_unsettled_asks(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("p1") as provider, asking.agent("a1") as agent:
        task, shown = await _asked(agent, provider)
        [info] = await pending_requests(answering)
        assert info.request_id == shown.request_id
        assert info.agent_id == "a1"
        assert info.delivered
        assert info.created_ms == shown.created_ms
        assert info.questions == ("question q1?",)
        await shown.answer(pick("yes"))
        await asyncio.wait_for(task, 5)
    assert await pending_requests(answering) == []


async def test_trim_standbys_dead_letters_and_report(make_broker, redis):
    broker = await make_broker(audit_maxlen=5)
    keys = broker.keys
    for i in range(20):
        await redis.xadd(keys.audit, {"event": "x", "i": str(i)})
    await redis.zadd(keys.standbys, {"tok:stale": 1, "tok:fresh": 2**50})
    await redis.xadd(keys.dead, {"entry": "1-1", "reason": "poison"})

    report = await run_housekeeping(broker)

    assert report.audit_trimmed == 15
    assert await redis.xlen(keys.audit) == 5
    assert report.standbys_dropped == 1
    assert await redis.zrange(keys.standbys, 0, -1) == ["tok:fresh"]
    assert report.dead_letters == 1 == await dead_letter_count(broker)
    assert await trim_audit(broker) == 0
    assert await drop_stale_standbys(broker) == 0


async def test_a_run_is_claimed_once(make_broker):
    one, two = await make_broker(), await make_broker()
    assert await claim_run(one, "housekeeping", "100", worker="w1", ttl=5)
    assert not await claim_run(two, "housekeeping", "100", worker="w2", ttl=5)
    assert await claim_run(two, "housekeeping", "101", worker="w2", ttl=5)


async def test_audit_digest_counts_each_end_once(make_broker, redis):
    asking, answering, other = await make_broker(), await make_broker(), await make_broker()
    async with answering.provider("p1") as provider:
        task, shown = await _asked(asking, provider)
        assert await digest_audit(answering) == []  # asked, not yet ended
        await shown.answer(pick("yes"))
        await asyncio.wait_for(task, 5)
        gone, shown_gone = await _asked(asking, provider)
        await cancelled_withdraws(gone, shown_gone)
    ends = await digest_audit(other)  # another worker reads on from the shared cursor
    assert ends is not None
    # the askers' log (the withdrawal) is read before the audit (the answer): each once, in either order
    assert sorted((e.request_id, e.outcome) for e in ends) == [
        (shown.request_id, "answered"),
        (shown_gone.request_id, "withdrawn"),
    ]
    assert all(e.seconds is not None and e.seconds >= 0 for e in ends)
    assert await digest_audit(answering) == []
    assert await redis.zcard(f"{answering.keys.prefix}maint:asked") == 0


async def test_a_refused_answer_is_digested_once_for_the_metrics(make_broker):
    asking, worker = await make_broker(), await make_broker()
    asking._core.rejected("r-forged", "an unsigned answer")  # what the asker does when it refuses one
    await asyncio.sleep(0.2)  # fired, not awaited
    ends = await digest_audit(worker)
    assert ends is not None and [(e.request_id, e.outcome) for e in ends] == [("r-forged", "rejected")]
    assert await digest_audit(worker) == []
