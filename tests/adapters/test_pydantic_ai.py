"""broker_adapters.pydantic_ai against a real Agent with TestModel / FunctionModel; no model calls."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed (pip install -e '.[pydantic-ai]')")

from pydantic_ai import Agent, DeferredToolRequests, Tool, ToolDenied
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionRequest, PlanReviewIntent
from broker_adapters import pydantic_ai as adapter
from broker_adapters.tool import ask_user_question_function


def _agent() -> Agent[None, str | DeferredToolRequests]:
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        TestModel(call_tools=["delete_file", "drop_table"]), output_type=[str, DeferredToolRequests]
    )
    ran: list[str] = []

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(f"delete {path}")
        return f"deleted {path}"

    @agent.tool_plain(requires_approval=True)
    def drop_table(name: str) -> str:
        """Drop a table."""
        ran.append(f"drop {name}")
        return f"dropped {name}"

    agent.ran = ran  # type: ignore[attr-defined]
    return agent


def _answers(**by_tool: tuple[tuple[str, ...], str | None]):
    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        items = []
        for item in request.questions:
            tool = item.question.split(":")[0].removeprefix("Allow ")
            selected, custom = by_tool[tool]
            items.append(AskUserQuestionAnswerItem(id=item.id, selected=selected, custom=custom))
        return AskUserQuestionAnswer(answers=tuple(items))

    return respond


@pytest.mark.timeout(30)
async def test_approvals_are_one_batch_and_denials_reach_the_model(human, agent):
    person = await human(_answers(delete_file=(("Approve",), None), drop_table=((), "not the users table")))
    subject = _agent()
    result = await adapter.run(subject, "clean up", asker=agent)
    assert subject.ran == ["delete a"]  # type: ignore[attr-defined]
    (request,) = person.seen  # both calls in one request
    assert [q.question.split(":")[0] for q in request.questions] == ["Allow delete_file", "Allow drop_table"]
    assert '"path": "a"' in (request.questions[0].detail or "") and request.agent == "adapter-test"
    returns = {
        part.tool_name: part
        for message in result.all_messages()
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart)
    }
    assert returns["delete_file"].content == "deleted a"
    assert returns["drop_table"].content == "The user denied this call: not the users table"
    assert isinstance(result.output, str)


@pytest.mark.timeout(30)
async def test_approve_maps_each_answer(human, agent):
    await human(_answers(delete_file=(("Deny",), None), drop_table=((), None)))
    first = await _agent().run("go")
    assert isinstance(first.output, DeferredToolRequests)
    results = await adapter.approve(first.output, agent)
    verdicts = {call.tool_name: results.approvals[call.tool_call_id] for call in first.output.approvals}
    assert all(isinstance(v, ToolDenied) for v in verdicts.values())
    assert verdicts["delete_file"].message == "The user denied this call."  # type: ignore[union-attr]
    assert "skipped" in verdicts["drop_table"].message  # type: ignore[union-attr]


@pytest.mark.timeout(30)
async def test_the_ask_tool_carries_intent_and_detail(human, agent):
    person = await human(
        lambda request: AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id="plan", selected=("Approve",)),))
    )
    call = {
        "questions": [
            {
                "id": "plan",
                "question": "Apply the migration plan?",
                "detail": "1. add column",
                "options": [{"label": "Approve"}, {"label": "Revise"}],
                "intent": {"kind": "plan-review", "approve": "Approve"},
            }
        ]
    }

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("ask_user_question", call)])
        last = messages[-1].parts[0]
        assert isinstance(last, ToolReturnPart)
        return ModelResponse(parts=[TextPart(str(last.content))])

    subject = Agent(FunctionModel(model), tools=[Tool(ask_user_question_function(agent, timeout=10))])
    result = await subject.run("plan it")
    assert json.loads(result.output) == {"answers": [{"id": "plan", "selected": ["Approve"]}]}
    item = person.seen[0].questions[0]
    assert item.intent == PlanReviewIntent(approve="Approve") and item.detail == "1. add column"
