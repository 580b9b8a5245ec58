"""Answer once for many: identical requests of several askers are one card, and the order
a provider presents its cards in (priority, then round-robin across agents). Real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import (
    Asker,
    AskUserQuestionItem,
    AskUserQuestionRequest,
    Provider,
    Remember,
    UserQuestionError,
)
from broker._keys import Keys
from tests.helpers import answer, code_of, next_pending, options, pick, plan_review, trail, until
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[1]


def deploy(qid: str = "q1", *, priority: str = "normal", detail: str | None = None) -> AskUserQuestionRequest:
    """The same question whatever its id: what several agents of a fleet ask."""
    item = AskUserQuestionItem(
        id=qid, question="Deploy 2.4.0 to production?", options=options("yes", "no"), detail=detail
    )
    return AskUserQuestionRequest(questions=(item,), priority=priority)


def numbered(n: int, *, priority: str = "normal") -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id="q1", question=f"Step {n}: go on?", options=options("yes", "no"))
    return AskUserQuestionRequest(questions=(item,), priority=priority)


@contextlib.asynccontextmanager
async def askers(make_broker: Callable[..., Any], *names: str) -> AsyncIterator[list[Any]]:
    """One live root agent per name, each in its own broker (its own asking process's client)."""
    async with contextlib.AsyncExitStack() as stack:
        agents = []
        for name in names:
            broker = await make_broker()
            agents.append(await stack.enter_async_context(broker.agent(name)))
        yield agents


async def audit_events(redis: Redis, keys: Keys, event: str) -> list[dict[str, str]]:
    return [fields for fields in await trail(redis, keys) if fields["event"] == event]


@pytest.fixture
async def provider(make_broker: Callable[..., Any]) -> AsyncIterator[Provider]:
    broker = await make_broker()
    async with broker.provider("desk") as provider:
        yield provider


# -- coalescing ----------------------------------------------------------------------------


async def test_identical_requests_of_three_askers_are_one_card_and_one_answer_settles_each_with_its_ids(
    make_broker, provider, redis
):
    async with askers(make_broker, "a1", "a2", "a3") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(f"q-{agent.id}"), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 3)
        assert provider.pending == [card]
        assert {asker.agent_id for asker in card.askers} == {"a1", "a2", "a3"}
        assert all(isinstance(asker, Asker) for asker in card.askers)
        await card.answer(pick("yes", card.request.questions[0].id), by="alice")
        results = await asyncio.wait_for(asyncio.gather(*asks), 5)
    assert results == [pick("yes", f"q-{name}") for name in ("a1", "a2", "a3")]
    answered = await audit_events(redis, provider.keys, "answered")
    assert sorted(e["rid"] for e in answered) == sorted(asker.request_id for asker in card.askers)
    assert {(e["by"], e["epoch"]) for e in answered} == {("alice", str(provider.epoch))}
    assert provider.pending == []


async def test_a_cancel_cancels_every_asker(make_broker, provider):
    async with askers(make_broker, "a1", "a2") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 2)
        await card.cancel("not today")
        for ask in asks:
            assert await asyncio.wait_for(code_of(ask), 5) == "ASK_CANCELLED"


async def test_an_asker_that_withdraws_leaves_the_card_and_the_others_still_get_the_answer(
    make_broker, provider, redis
):
    async with askers(make_broker, "a1", "a2", "a3") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 3)
        card.changed.clear()
        asks[1].cancel()
        await asyncio.wait_for(card.changed.wait(), 5)
        assert {asker.agent_id for asker in card.askers} == {"a1", "a3"}
        assert not card.withdrawn.is_set() and provider.pending == [card]
        await card.answer(pick("no"))
        assert list(await asyncio.wait_for(asyncio.gather(asks[0], asks[2]), 5)) == [pick("no"), pick("no")]
    withdrawn = await audit_events(redis, provider.keys, "withdrawn")
    assert len(withdrawn) == 1 and len(await audit_events(redis, provider.keys, "answered")) == 2


async def test_the_card_is_withdrawn_only_when_its_last_asker_withdraws(make_broker, provider):
    async with askers(make_broker, "a1", "a2") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 2)
        asks[0].cancel()
        await until(lambda: len(card.askers) == 1)
        assert not card.withdrawn.is_set()
        asks[1].cancel()
        await asyncio.wait_for(card.withdrawn.wait(), 5)
        assert provider.pending == []
        assert await code_of(card.answer(pick("yes"))) == "NOT_PENDING"


async def test_an_asker_arriving_while_the_human_answers_joins_the_card_and_gets_the_answer(make_broker, provider):
    async with askers(make_broker, "early", "late") as (early, late):
        first = asyncio.ensure_future(early.ask(deploy(), timeout=30))
        card = await next_pending(provider)  # handed out: a human is reading it
        card.changed.clear()
        second = asyncio.ensure_future(late.ask(deploy("other-id"), timeout=30))
        await asyncio.wait_for(card.changed.wait(), 5)
        assert [asker.agent_id for asker in card.askers] == ["early", "late"]
        assert provider.pending == [card]
        await card.answer(pick("yes"))
        assert await asyncio.wait_for(first, 5) == pick("yes")
        assert await asyncio.wait_for(second, 5) == pick("yes", "other-id")


async def test_first_answer_wins_for_the_whole_card(make_broker, provider):
    async with askers(make_broker, "a1", "a2") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 2)
        await card.answer(pick("yes"))
        assert await code_of(card.answer(pick("no"))) == "NOT_PENDING"
        assert await asyncio.wait_for(asyncio.gather(*asks), 5) == [pick("yes"), pick("yes")]


async def test_opting_out_asking_twice_or_a_different_plan_is_never_coalesced(make_broker, provider):
    async with askers(make_broker, "a1", "a2", "a3") as (a1, a2, a3):
        tasks = [
            asyncio.ensure_future(a1.ask(deploy(), timeout=30)),
            asyncio.ensure_future(a2.ask(deploy(), timeout=30, coalesce=False)),  # opted out
            asyncio.ensure_future(a1.ask(deploy(), timeout=30)),  # the same asker asks it twice: twice
            asyncio.ensure_future(a1.ask(plan_review(), timeout=30)),
            asyncio.ensure_future(a3.ask(plan_review_of("# Plan\n1. drop the table"), timeout=30)),
        ]
        cards = [await next_pending(provider) for _ in tasks]
        assert all(len(card.askers) == 1 for card in cards)
        for card in cards:
            await card.answer(answer((card.request.questions[0].id, (card.request.questions[0].labels[0],), None)))
        await asyncio.wait_for(asyncio.gather(*tasks), 5)


def plan_review_of(plan: str) -> AskUserQuestionRequest:
    request = plan_review()
    item = request.questions[0]
    return AskUserQuestionRequest(questions=(AskUserQuestionItem(**{**_fields(item), "detail": plan}),))


def _fields(item: AskUserQuestionItem) -> dict[str, Any]:
    return {name: getattr(item, name) for name in item.__struct_fields__}


async def test_a_coalesced_card_survives_the_providers_kill_9_and_the_new_holder_shows_it_once(
    make_broker, redis_server: RedisServer, namespace: str, redis
):
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.provider_process", redis_server.url, namespace, "old", "yes", "600", "1.0",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert (await asyncio.wait_for(holder.stdout.readline(), 20)).startswith(b"HOLDING")  # type: ignore[union-attr]
        async with askers(make_broker, "a1", "a2", "a3") as agents:
            asks = [asyncio.ensure_future(agent.ask(deploy(f"id-{agent.id}"), timeout=60)) for agent in agents]
            got = await asyncio.wait_for(holder.stdout.readline(), 10)  # type: ignore[union-attr]
            assert got.startswith(b"GOT")
            await asyncio.sleep(0.3)  # the other two join the old holder's card
            holder.send_signal(signal.SIGKILL)
            await holder.wait()
            standby = await make_broker(lease_ttl=1.0)
            async with standby.provider("new", standby=True) as new:
                card = await next_pending(new, timeout=10)
                await until(lambda: len(card.askers) == 3)
                assert new.pending == [card]
                await card.answer(pick("no", card.request.questions[0].id))
                results = await asyncio.wait_for(asyncio.gather(*asks), 5)
            assert results == [pick("no", f"id-{name}") for name in ("a1", "a2", "a3")]
            answered = await audit_events(redis, new.keys, "answered")
            assert len(answered) == 3 and {e["epoch"] for e in answered} == {str(new.epoch)}
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


# -- priorities and fairness ---------------------------------------------------------------


async def test_three_agents_times_three_priorities_are_handed_out_urgent_first_and_round_robin(make_broker, provider):
    asking = await make_broker()
    async with contextlib.AsyncExitStack() as stack:
        agents = [await stack.enter_async_context(asking.agent(name)) for name in ("a", "b", "c")]
        tasks = []
        n = 0
        for priority in ("low", "normal", "urgent"):  # asked least urgent first
            for agent in agents:
                for _ in range(2 if agent.id == "a" else 1):  # a asks twice per level
                    n += 1
                    tasks.append(asyncio.ensure_future(agent.ask(numbered(n, priority=priority), timeout=30)))
                    await asyncio.sleep(0.01)  # a strict arrival order
        await until(lambda: len(provider.pending) == 12)  # delivered, none handed out yet
        order = [await next_pending(provider) for _ in tasks]
        shown = [(card.priority, card.agent_id) for card in order]
        assert shown == [
            ("urgent", "a"), ("urgent", "b"), ("urgent", "c"), ("urgent", "a"),
            ("normal", "a"), ("normal", "b"), ("normal", "c"), ("normal", "a"),
            ("low", "a"), ("low", "b"), ("low", "c"), ("low", "a"),
        ]  # fmt: skip
        assert [(c.priority, c.agent_id) for c in provider.pending] == shown  # the list the UIs show, same order
        assert [provider.first(n) for n in (0, 1, 5, 20)] == [provider.pending[:n] for n in (0, 1, 5, 20)]
        assert provider.pending_count == 12
        for card in order:
            await card.answer(pick("yes"))
        await asyncio.wait_for(asyncio.gather(*tasks), 5)


async def test_one_chatty_agent_cannot_push_another_agents_question_to_the_back(make_broker, provider):
    async with askers(make_broker, "chatty", "quiet") as (chatty, quiet):
        flood = [asyncio.ensure_future(chatty.ask(numbered(n), timeout=30)) for n in range(60)]
        await until(lambda: len(provider.pending) == 60, within=10)
        single = asyncio.ensure_future(quiet.ask(numbered(999), timeout=30))
        await until(lambda: len(provider.pending) == 61)
        first, second = await next_pending(provider), await next_pending(provider)
        assert [first.agent_id, second.agent_id] == ["chatty", "quiet"]
        assert [card.agent_id for card in provider.pending][:3] == ["chatty", "quiet", "chatty"]
        for card in provider.pending:
            await card.answer(pick("yes"))
        await asyncio.wait_for(asyncio.gather(single, *flood), 10)


async def test_an_urgent_asker_joining_a_waiting_card_moves_it_ahead(make_broker, provider):
    desk = provider
    async with askers(make_broker, "a1", "a2", "a3") as (a1, a2, a3):
        earlier = asyncio.ensure_future(a3.ask(numbered(1), timeout=30))
        await until(lambda: len(desk.pending) == 1)
        normal = asyncio.ensure_future(a1.ask(deploy(), timeout=30))
        await until(lambda: len(desk.pending) == 2)
        urgent = asyncio.ensure_future(a2.ask(deploy(priority="urgent"), timeout=30))
        await until(lambda: any(len(card.askers) == 2 for card in desk.pending))
        card = desk.pending[0]
        assert card.priority == "urgent" and len(card.askers) == 2
        assert await next_pending(desk) is card
        await card.answer(pick("yes"))
        await (await next_pending(desk)).answer(pick("no"))
        assert list(await asyncio.wait_for(asyncio.gather(normal, urgent, earlier), 5)) == [
            pick("yes"),
            pick("yes"),
            pick("no"),
        ]


async def test_the_only_urgent_asker_withdrawing_puts_the_card_back_among_the_normal_ones(make_broker, provider):
    desk = provider
    async with askers(make_broker, "a1", "a2", "a3") as (a1, a2, a3):
        earlier = asyncio.ensure_future(a3.ask(numbered(1), timeout=30))
        await until(lambda: desk.pending_count == 1)
        normal = asyncio.ensure_future(a1.ask(deploy(), timeout=30))
        await until(lambda: desk.pending_count == 2)
        urgent = asyncio.ensure_future(a2.ask(deploy(priority="urgent"), timeout=30))
        await until(lambda: desk.first(1)[0].priority == "urgent")
        card = desk.first(1)[0]
        card.changed.clear()
        urgent.cancel()
        await asyncio.wait_for(card.changed.wait(), 5)
        assert (card.priority, [asker.agent_id for asker in card.askers]) == ("normal", ["a1"])
        assert [c.agent_id for c in desk.pending] == ["a3", "a1"] and desk.first(2) == desk.pending
        assert await next_pending(desk) is not card  # a3's older question comes first again
        assert await next_pending(desk) is card
        with pytest.raises(TimeoutError):
            await next_pending(desk, 0.3)  # the card is handed out once, not again for each level it had
        for shown in desk.pending:
            await shown.answer(pick("yes"))
        assert list(await asyncio.wait_for(asyncio.gather(normal, earlier), 5)) == [pick("yes")] * 2
        assert (desk.pending_count, desk.first(3)) == (0, [])


async def test_a_card_leaves_pending_with_its_last_asker_however_each_one_went(make_broker, provider):
    async with askers(make_broker, "a1", "a2", "a3", "a4") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 4)
        for gone in (asks[0], asks[2]):  # the first asker (the card's id) among them
            gone.cancel()
        await until(lambda: len(card.askers) == 2)
        assert provider.pending == [card] and provider.pending_count == 1
        await card.answer(pick("no"))
        assert list(await asyncio.wait_for(asyncio.gather(asks[1], asks[3]), 5)) == [pick("no")] * 2
        assert (provider.pending, provider.pending_count, provider.first(1)) == ([], 0, [])
        again = asyncio.ensure_future(agents[0].ask(deploy(), timeout=30))  # a new card, not the settled one
        fresh = await next_pending(provider)
        assert fresh is not card and [asker.agent_id for asker in fresh.askers] == ["a1"]
        await fresh.answer(pick("yes"))
        assert await asyncio.wait_for(again, 5) == pick("yes")


@pytest.mark.parametrize("priority", ["critical", "", "URGENT"])
async def test_an_unknown_priority_is_bad_request(make_broker, provider, priority):
    broker = await make_broker()
    with pytest.raises(UserQuestionError) as raised:
        await broker.ask(deploy(priority=priority), timeout=5)
    assert raised.value.code == "BAD_REQUEST" and "priority" in str(raised.value)


async def test_priority_is_on_the_wire_only_when_not_normal(make_broker, provider, redis):
    broker = await make_broker()
    ask = asyncio.ensure_future(broker.ask(deploy(priority="low"), timeout=30))
    card = await next_pending(provider)
    entries = await redis.xrange(broker.keys.requests)
    assert '"priority":"low"' in entries[-1][1]["request"]
    assert card.priority == "low"
    await card.answer(pick("yes"))
    assert await asyncio.wait_for(ask, 5) == pick("yes")


async def test_remembering_a_coalesced_answer_decides_for_each_asker_in_scope(make_broker, provider):
    async with askers(make_broker, "a1", "a2") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 2)
        await card.answer(pick("yes"), by="alice", remember=Remember(scope="agent", ttl=60))
        assert await asyncio.wait_for(asyncio.gather(*asks), 5) == [pick("yes")] * 2
        decisions = await (await make_broker()).decisions()
        assert sorted(d.agent for d in decisions) == ["a1", "a2"]  # agent scope: one for each asker
        again = [await asyncio.wait_for(agent.ask(deploy("later")), 5) for agent in agents]
    assert again == [pick("yes", "later")] * 2  # answered by the decisions, no human asked
    assert provider.pending == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch", [256, 1], ids=["one-call", "a-call-per-asker"])
async def test_remembering_a_coalesced_answer_is_stored_when_its_first_askers_request_is_gone(
    make_broker, provider, redis, monkeypatch, batch
):
    """The decision went with the first asker's settlement only: that request no longer pending (its
    hash lapsed, or it was withdrawn just before), the answer still reached the others and
    ``answer(remember=...)`` returned, but nothing was remembered. ``batch`` 1 splits the card's
    settlements over several settle.lua calls (as a card of more than 256 askers is)."""
    monkeypatch.setattr("broker.answering.settling._SETTLE_BATCH", batch)
    async with askers(make_broker, "a1", "a2", "a3") as agents:
        asks = {agent.id: asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents}
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 3)
        first, *others = card.askers
        await redis.delete(provider.keys.request(first.request_id))  # it lapsed: no notice comes
        await card.answer(pick("yes"), by="alice", remember=Remember(ttl=60))
        got = await asyncio.wait_for(asyncio.gather(*(asks[asker.agent_id] for asker in others)), 5)
        assert got == [pick("yes")] * 2
        asks[first.agent_id].cancel()
        await asyncio.gather(asks[first.agent_id], return_exceptions=True)
        decisions = await (await make_broker()).decisions()
        assert [(d.scope, d.selected, d.by) for d in decisions] == [("namespace", ("yes",), "alice")]
        assert decisions[0].request_id in {asker.request_id for asker in others}
        remembered = await audit_events(redis, provider.keys, "remembered")
        assert len(remembered) == 1
        later = await make_broker()
        assert await asyncio.wait_for(later.ask(deploy("later")), 5) == pick("yes", "later")  # no human
    assert provider.pending == []


@pytest.mark.timeout(30)
async def test_an_asker_found_gone_when_its_card_is_settled_leaves_the_card(make_broker, provider, redis):
    """A request whose hash lapsed sends no notice: the settle finds it. Its card does not stay in
    ``pending`` (never to be handed out again) once its last asker turned out gone."""
    async with askers(make_broker, "a1") as (agent,):
        asking = asyncio.ensure_future(agent.ask(deploy(), timeout=30))
        card = await next_pending(provider)
        await redis.delete(provider.keys.request(card.request_id))
        assert await code_of(card.answer(pick("yes"))) == "NOT_PENDING"
        assert provider.pending == [] and provider.pending_count == 0
        assert card.withdrawn.is_set()  # the UI takes it down
        asking.cancel()
        await asyncio.gather(asking, return_exceptions=True)


@pytest.mark.timeout(30)
async def test_a_coalesced_card_settled_over_several_calls_remembers_its_decision_once(
    make_broker, provider, redis, monkeypatch
):
    """Each call of a split card carries the decision again (its first asker may be gone): written once."""
    monkeypatch.setattr("broker.answering.settling._SETTLE_BATCH", 1)
    async with askers(make_broker, "a1", "a2", "a3") as agents:
        asks = [asyncio.ensure_future(agent.ask(deploy(), timeout=30)) for agent in agents]
        card = await next_pending(provider)
        await until(lambda: len(card.askers) == 3)
        await card.answer(pick("yes"), by="alice", remember=Remember(ttl=60))
        assert await asyncio.wait_for(asyncio.gather(*asks), 5) == [pick("yes")] * 3
        decisions = await (await make_broker()).decisions()
        assert [d.request_id for d in decisions] == [card.askers[0].request_id]
        assert len(await audit_events(redis, provider.keys, "remembered")) == 1
