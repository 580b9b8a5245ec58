"""The in-process answerer waterfall: order, prepend, scope, next(), dispose."""

from __future__ import annotations

import asyncio

import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, Next, UserQuestionError
from tests.helpers import code_of, next_pending, one_question, pick


async def test_answerers_run_in_registration_order_and_prepend_goes_first(make_broker):
    broker = await make_broker()
    heard: list[str] = []

    def passing(name: str):
        async def answerer(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
            heard.append(name)
            return await next_()

        return answerer

    async def claiming(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        heard.append("claim")
        return pick("yes")

    broker.on_request(passing("second"))
    broker.on_request(claiming)
    broker.on_request(passing("first"), prepend=True)
    assert await broker.ask(one_question()) == pick("yes")
    assert heard == ["first", "second", "claim"]


async def test_the_provider_is_the_end_of_the_chain(make_broker):
    asking, answering = await make_broker(), await make_broker()
    passed = []

    async def passing(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        passed.append(request)
        return await next_()

    asking.on_request(passing)
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question(), timeout=10))
        await (await next_pending(provider)).answer(pick("no"))
        assert await task == pick("no")
    assert len(passed) == 1


async def test_a_scoped_answerer_hears_only_its_agents_requests(make_broker):
    broker = await make_broker()
    heard: list[str | None] = []

    async def scoped(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        heard.append(request.agent)
        return pick("yes")

    async def fallback(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        return pick("no")

    async with broker.agent("alpha") as alpha, broker.agent("beta") as beta:
        broker.on_request(scoped, agent=alpha)
        broker.on_request(fallback)
        assert await alpha.ask(one_question()) == pick("yes")
        assert await beta.ask(one_question()) == pick("no")
        assert await broker.ask(one_question()) == pick("no")
    assert heard == ["alpha"]


async def test_the_caller_gate_runs_before_any_answerer(make_broker):
    broker = await make_broker()
    heard = []

    async def answerer(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        heard.append(request)
        return pick("yes")

    broker.on_request(answerer)
    async with broker.agent("parent") as parent, broker.agent("child", owner=parent) as child:
        assert await code_of(child.ask(one_question())) == "DELEGATED_CALLER"
    assert heard == []


async def test_a_disposed_answerer_is_not_asked(make_broker):
    broker = await make_broker()

    async def answerer(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        return pick("yes")

    dispose = broker.on_request(answerer)
    dispose()
    dispose()  # idempotent
    assert await code_of(broker.ask(one_question())) == "NO_PROVIDER"


async def test_an_answerers_answer_is_validated(make_broker):
    broker = await make_broker()

    async def sloppy(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        return pick("maybe")

    broker.on_request(sloppy)
    with pytest.raises(UserQuestionError) as raised:
        await broker.ask(one_question())
    assert raised.value.code == "BAD_ANSWER"


async def test_an_abort_stops_a_hanging_answerer(make_broker):
    broker = await make_broker()
    stopped = asyncio.Event()

    async def hanging(request: AskUserQuestionRequest, next_: Next) -> AskUserQuestionAnswer:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    broker.on_request(hanging)
    abort = asyncio.Event()
    task = asyncio.create_task(broker.ask(one_question(), abort=abort))
    await asyncio.sleep(0.05)
    abort.set()
    assert await code_of(task) == "ASK_ABORTED"
    assert stopped.is_set()
