"""The life of one ask as a reader sees it (broker/asking/_ask.py): asked, waiting, detached, re-attached, ended."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.asking._ask import Ask
from broker.asking._ask_state import TRANSITIONS, AskState
from broker.errors import UserQuestionError
from tests.helpers import next_pending, one_question, pick, until

pytestmark = pytest.mark.timeout(30)

KEY = "deploy-states"


def the_ask(broker: Any) -> Ask:
    (ask,) = broker._core.asks.values()
    assert isinstance(ask, Ask)
    return ask


def test_an_ended_ask_goes_nowhere_and_every_state_is_reachable() -> None:
    assert TRANSITIONS[AskState.ENDED] == frozenset()
    reachable = {AskState.ASKED} | {state for targets in TRANSITIONS.values() for state in targets}
    assert reachable == set(AskState)


async def test_an_ask_waits_on_its_own_request_then_ends(make_broker) -> None:
    holder, asker = await make_broker(), await make_broker()
    async with holder.provider("ui") as provider:
        asking = asyncio.ensure_future(asker.ask(one_question("yes", "no"), timeout=20))
        pending = await next_pending(provider)
        ask = the_ask(asker)
        assert ask.state is AskState.WAITING
        await pending.answer(pick("yes"))
        assert await asyncio.wait_for(asking, 10) == pick("yes")
    assert ask.state is AskState.ENDED  # type: ignore[comparison-overlap]  # mypy keeps the narrowing above across awaits


async def test_a_cancelled_keyed_ask_is_detached_and_a_new_one_re_attaches(make_broker, monkeypatch) -> None:
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await make_broker()
        async with first.agent("ci") as agent:
            asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
            pending = await next_pending(provider)
            ask = the_ask(first)
            states: list[AskState] = []
            to = Ask._to

            def record(self: Ask, state: AskState) -> None:  # on the class: an Ask is slotted
                if self is ask:
                    states.append(state)
                to(self, state)

            monkeypatch.setattr(Ask, "_to", record)
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
        assert states == [AskState.DETACHED, AskState.ENDED]
        await until(lambda: pending.asker_away)
        second = await make_broker()
        async with second.agent("ci") as agent:
            again = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
            await until(lambda: bool(second._core.asks) and the_ask(second).state is AskState.REATTACHED)
            await pending.answer(pick("no"))
            assert await asyncio.wait_for(again, 10) == pick("no")


async def test_an_outcome_that_won_the_race_is_returned_though_the_abort_cancelled_the_inbox_future(
    make_broker, answering, monkeypatch
) -> None:
    """An ask waits on the inbox's future itself (no follower of it: a third of a kilobyte less per waiting ask), so
    an abort cancels that future; an answer settled before the abort, its notice not yet taken by the inbox, is
    still returned: the withdrawal finds it where it is durable (withdraw.lua says settled, its key holds it)."""
    broker = await make_broker()
    inbox = broker._core.inbox
    take, popped, held = inbox._take, asyncio.Event(), asyncio.Event()

    async def held_take(notices: list[str]) -> None:
        popped.set()
        await held.wait()
        await take(notices)

    monkeypatch.setattr(inbox, "_take", held_take)
    abort = asyncio.Event()
    task = asyncio.create_task(broker.ask(one_question("yes", "no"), abort=abort))
    pending = await next_pending(answering)
    await pending.answer(pick("yes"))
    await asyncio.wait_for(popped.wait(), 5)  # the inbox took the notice, and holds it
    abort.set()
    try:
        assert await asyncio.wait_for(task, 10) == pick("yes")
    finally:
        held.set()


@pytest.mark.parametrize("options", [{"remember": 1}, {"coalesce": "no"}, {"remember": None}], ids=repr)
async def test_remember_and_coalesce_other_than_true_or_false_are_bad_requests(make_broker, options) -> None:
    """Routings are shared per choice: 1 (equal to True as a key) must still be refused, not taken for True."""
    broker = await make_broker()
    async with broker.agent("ci") as agent:
        for asking in (broker.ask(one_question("yes", "no"), **options), agent.ask(one_question("yes"), **options)):
            with pytest.raises(UserQuestionError) as raised:
                await asyncio.wait_for(asking, 5)
            assert raised.value.code == "BAD_REQUEST"
