"""The life of one ask as a reader sees it (broker/_ask.py): asked, waiting, detached, re-attached, ended."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker._ask import TRANSITIONS, AskState, _Ask
from tests.helpers import one_question, pick
from tests.test_ask import next_pending
from tests.test_durable import until

pytestmark = pytest.mark.timeout(30)

KEY = "deploy-states"


def the_ask(broker: Any) -> _Ask:
    (ask,) = broker._asks.values()
    assert isinstance(ask, _Ask)
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
    assert ask.state is AskState.ENDED


async def test_a_cancelled_keyed_ask_is_detached_and_a_new_one_re_attaches(make_broker, monkeypatch) -> None:
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await make_broker()
        async with first.agent("ci") as agent:
            asking = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
            pending = await next_pending(provider)
            ask = the_ask(first)
            states: list[AskState] = []
            to = _Ask._to

            def record(self: _Ask, state: AskState) -> None:  # on the class: an _Ask is slotted
                if self is ask:
                    states.append(state)
                to(self, state)

            monkeypatch.setattr(_Ask, "_to", record)
            asking.cancel()
            await asyncio.gather(asking, return_exceptions=True)
        assert states == [AskState.DETACHED, AskState.ENDED]
        await until(lambda: pending.asker_away)
        second = await make_broker()
        async with second.agent("ci") as agent:
            again = asyncio.ensure_future(agent.ask(one_question("yes", "no"), key=KEY))
            await until(lambda: bool(second._asks) and the_ask(second).state is AskState.REATTACHED)
            await pending.answer(pick("no"))
            assert await asyncio.wait_for(again, 10) == pick("no")
