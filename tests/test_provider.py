"""The provider lease: one holder, fencing epochs, standbys, re-delivery, poison entries."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker import PendingRequest, UserQuestionError
from tests.helpers import code_of, next_pending, one_question, pick


async def test_a_second_provider_without_standby_is_refused_and_replaces_nothing(make_broker, redis):
    first, second = await make_broker(), await make_broker()
    async with first.provider("first") as holder:
        with pytest.raises(UserQuestionError) as raised:
            async with second.provider("second", standby=False):
                pass
        assert raised.value.code == "DUPLICATE_PROVIDER"
        assert "first" in raised.value.message
        assert (await redis.get(first.keys.provider)).startswith(f"{holder.epoch}:")


async def test_the_epoch_increases_on_every_acquisition(make_broker):
    broker = await make_broker()
    epochs = []
    for _ in range(3):
        async with broker.provider("p") as provider:
            epochs.append(provider.epoch)
    assert epochs == sorted(set(epochs)) and len(epochs) == 3


async def test_a_clean_release_hands_over_at_once_not_after_the_ttl(make_broker):
    holder, standby = await make_broker(lease_ttl=30.0), await make_broker(lease_ttl=30.0)
    standing = asyncio.Event()
    took_over: list[float] = []

    async def stand_by() -> None:
        async with standby.provider("standby", on_standby=lambda _: standing.set()):
            took_over.append(time.monotonic())

    async with asyncio.TaskGroup() as tasks, holder.provider("holder"):
        tasks.create_task(stand_by())
        await asyncio.wait_for(standing.wait(), 5)
        released = time.monotonic()
    assert took_over[0] - released < 5  # far inside the 30 s lease


_PROVIDER_WORK = {"Provider.keep_lease", "Provider.read", "Provider.reclaim", "Provider.seal_audit", "Settler.run"}


def _provider_work() -> set[str]:
    return {task.get_name() for task in asyncio.all_tasks() if not task.done()} & _PROVIDER_WORK


async def test_a_provider_owns_its_background_work_and_its_settling_and_leaves_none_behind(make_broker):
    """Its loops and the task that sends its settlements run while the provider block does, and end with it."""
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        assert _provider_work() == _PROVIDER_WORK
        asked = asyncio.ensure_future(asking.ask(one_question(), timeout=30))
        await (await next_pending(provider)).answer(pick("yes"))
        assert await asked == pick("yes")
    assert _provider_work() == set()


async def test_a_standby_re_delivers_everything_the_old_holder_left_unsettled(make_broker, redis):
    asking, first, second = await make_broker(), await make_broker(), await make_broker()
    async with first.provider("first") as old:
        asks = [asyncio.create_task(asking.ask(one_question())) for _ in range(5)]
        seen = {(await next_pending(old)).request_id for _ in range(5)}
    async with second.provider("second") as new:
        again = [await next_pending(new) for _ in range(5)]
        assert {p.request_id for p in again} == seen
        for pending in again:
            await pending.answer(pick("yes"))
        assert await asyncio.gather(*asks) == [pick("yes")] * 5
    audit = await redis.xrange(asking.keys.audit)
    answered = [fields["rid"] for _, fields in audit if fields["event"] == "answered"]
    assert sorted(answered) == sorted(seen)
    assert all(f["epoch"] == str(new.epoch) for _, f in audit if f["event"] == "answered")


async def test_a_provider_whose_lease_lapsed_cannot_answer_and_stops(make_broker, redis):
    asking, answering = await make_broker(), await make_broker(lease_ttl=30.0)
    async with answering.provider("stalled") as provider:
        task = asyncio.create_task(asking.ask(one_question()))
        pending = await next_pending(provider)
        await redis.delete(answering.keys.provider)  # its lease lapsed while it stalled
        assert await code_of(pending.answer(pick("yes"))) == "LEASE_LOST"
        assert provider.lost
        with pytest.raises(UserQuestionError) as raised:
            await anext(aiter(provider))
        assert raised.value.code == "LEASE_LOST"
        assert not task.done()
        task.cancel()


async def test_a_lease_taken_by_another_fences_the_old_holder(make_broker, redis):
    asking, old_broker, new_broker = await make_broker(), await make_broker(), await make_broker()
    async with old_broker.provider("old") as old:
        task = asyncio.create_task(asking.ask(one_question()))
        pending = await next_pending(old)
        await redis.delete(old_broker.keys.provider)
        async with new_broker.provider("new") as new:
            assert new.epoch > old.epoch
            assert await code_of(pending.answer(pick("no"))) == "LEASE_LOST"
            again = await next_pending(new)
            await again.answer(pick("yes"))
            assert await task == pick("yes")


async def test_a_request_of_a_gone_agent_is_withdrawn_not_presented(make_broker, redis):
    asking, first, second = await make_broker(), await make_broker(), await make_broker()
    async with asking.agent("root") as agent, first.provider("first") as old:
        task = asyncio.create_task(agent.ask(one_question()))
        await next_pending(old)
        await redis.delete(asking.keys.agent("root"))  # the record expired
    async with second.provider("second") as new:
        assert await code_of(task) == "CALLER_NOT_LIVE"
        with pytest.raises(TimeoutError):
            await next_pending(new, 0.5)


async def test_a_request_of_a_stopped_process_is_withdrawn_not_presented(make_broker, redis):
    asking, first, second = await make_broker(), await make_broker(), await make_broker()
    async with first.provider("first") as old:
        task = asyncio.create_task(asking.ask(one_question()))
        await next_pending(old)
    await redis.delete(asking.keys.client(asking.client_id))  # the asking process stopped beating
    async with second.provider("second") as new:
        with pytest.raises(TimeoutError):
            await next_pending(new, 0.5)
    assert await code_of(task) == "CALLER_NOT_LIVE"
    audit = await redis.xrange(asking.keys.audit)
    assert any(f["event"] == "withdrawn" and "stopped" in f.get("reason", "") for _, f in audit)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"junk": "\x00\xff"}, id="no-fields"),
        pytest.param({"kind": "ask", "rid": "r1"}, id="missing-client"),
        pytest.param({"kind": "mystery", "rid": "r1", "client": "c"}, id="unknown-kind"),
        pytest.param({"kind": "ask", "rid": "x" * 10_000, "client": "c"}, id="huge-id"),
    ],
)
async def test_poison_entries_are_dead_lettered_and_good_requests_still_flow(make_broker, redis, fields):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        await redis.xadd(answering.keys.requests, fields)
        task = asyncio.create_task(asking.ask(one_question()))
        pending = await next_pending(provider)
        await pending.answer(pick("yes"))
        assert await task == pick("yes")
    dead = await redis.xrange(answering.keys.dead)
    assert len(dead) == 1 and dead[0][1]["reason"]
    assert await redis.xlen(answering.keys.requests) == 0


async def test_an_undecodable_request_fails_its_asker_with_bad_request(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    # a standby that has not taken over yet: the ask is accepted and waits in the stream
    await redis.zadd(asking.keys.standbys, {"token:later": int(time.time() * 1000) + 60_000})
    task = asyncio.create_task(asking.ask(one_question()))
    while not await redis.xlen(asking.keys.requests):
        await asyncio.sleep(0.01)
    [(entry, fields)] = await redis.xrange(asking.keys.requests)
    # corrupted: the request a provider presents is the stream entry's (the hash keeps its own copy)
    await redis.xdel(asking.keys.requests, entry)
    corrupted = await redis.xadd(asking.keys.requests, {**fields, "request": "{not json"})
    await redis.hset(asking.keys.request(fields["rid"]), mapping={"entry": corrupted, "request": "{not json"})
    async with answering.provider("ui") as provider:
        assert await code_of(task) == "BAD_REQUEST"
        with pytest.raises(TimeoutError):
            await next_pending(provider, 0.3)
    [(_, dead)] = await redis.xrange(answering.keys.dead)
    assert "undeliverable" in dead["reason"]


async def test_the_script_cache_being_flushed_is_survived(make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        await redis.script_flush()
        task = asyncio.create_task(asking.ask(one_question()))
        pending = await next_pending(provider)
        await pending.answer(pick("yes"))
        assert await task == pick("yes")


@pytest.mark.timeout(30)
async def test_changes_names_each_withdrawn_or_changed_card_once_in_order(make_broker):
    """One waiter for every card (a web page's): each card withdrawn or changed since the last call, once."""
    asking, answering = await make_broker(), await make_broker()
    async with asyncio.timeout(20), answering.provider("p") as provider:
        provider.track_changes()
        asks = {n: asyncio.create_task(asking.ask(one_question("yes", f"no {n}"))) for n in range(3)}
        shown = [await next_pending(provider) for _ in range(3)]
        cards = {int(card.request.questions[0].labels[1].split()[1]): card for card in shown}
        for n in (2, 0):
            asks[n].cancel()
            await asyncio.gather(asks[n], return_exceptions=True)
        changed: list[PendingRequest] = []
        while len(changed) < 2:
            changed += await provider.changes()
        assert changed == [cards[2], cards[0]] and all(card.is_withdrawn for card in changed)
        assert not cards[1].is_withdrawn
        asks[1].cancel()
        await asyncio.gather(asks[1], return_exceptions=True)
        assert await provider.changes() == [cards[1]] and cards[1].is_withdrawn
