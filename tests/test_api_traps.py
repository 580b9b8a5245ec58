"""Issue 16, "the Python API without traps": what a user writes first should work or fail clearly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from msgspec.structs import replace

from broker import AskUserQuestionRequest, Provider, UserQuestionError
from tests.helpers import answer, one_question, plan_review


@pytest.fixture
async def answering(make_broker: Callable[..., Any]) -> AsyncIterator[Provider]:
    broker = await make_broker()
    async with broker.provider("ui") as provider:
        yield provider


@pytest.mark.timeout(20)
async def test_a_request_may_name_its_agent_by_the_live_instance(make_broker, answering):
    broker = await make_broker()
    async with broker.agent("child") as agent:
        request = replace(one_question(), agent=agent)  # the natural reading of the seeds
        asking = asyncio.ensure_future(broker.ask(request, timeout=10))
        delivery = asyncio.ensure_future(anext(aiter(answering)))
        await asyncio.wait({asking, delivery}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if not delivery.done():
            delivery.cancel()
            await asyncio.gather(delivery, return_exceptions=True)
            raise AssertionError(f"not delivered: {asking.exception() if asking.done() else 'still waiting'}")
        pending = delivery.result()
        assert pending.request.agent == "child"  # asked as that instance, sent by id
        await pending.answer(answer(("q1", ("yes",), None)))
        assert await asyncio.wait_for(asking, 10) == answer(("q1", ("yes",), None))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("agent", [42, object(), ("a",)], ids=["int", "object", "tuple"])
async def test_any_other_non_string_agent_is_a_bad_request(make_broker, answering, agent):
    broker = await make_broker()
    request = AskUserQuestionRequest(questions=one_question().questions, agent=agent)
    with pytest.raises(UserQuestionError) as raised:
        await asyncio.wait_for(broker.ask(request, timeout=5), 10)
    assert raised.value.code == "BAD_REQUEST"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("detail", ["", "   \n"], ids=["empty", "blank"])
async def test_an_intent_with_a_blank_detail_is_bad_intent(make_broker, answering, detail):
    """Issue 16: an empty detail was accepted and shown as a plan card with no plan."""
    broker = await make_broker()
    request = plan_review()
    request = replace(request, questions=(replace(request.questions[0], detail=detail),))
    with pytest.raises(UserQuestionError) as raised:
        await asyncio.wait_for(broker.ask(request, timeout=5), 10)
    assert raised.value.code == "BAD_INTENT"
