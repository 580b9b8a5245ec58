"""broker_adapters.openai_agents against the real SDK with a scripted fake Model; no network."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed (pip install -e '.[openai-agents]')")

from agents import Agent, RunConfig, function_tool

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionRequest, PlanReviewIntent
from broker_adapters import openai_agents as adapter
from tests.adapters.scripted_model import ScriptedModel, call, text

OFFLINE = RunConfig(tracing_disabled=True)


def _outputs(model: ScriptedModel) -> dict[str, Any]:
    return {i["call_id"]: i["output"] for i in model.inputs[-1] if i.get("type") == "function_call_output"}


@pytest.mark.timeout(30)
async def test_the_tool_takes_the_full_request_shape(human, agent):
    person = await human(
        lambda request: AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id="plan", selected=("Approve",)),))
    )
    question = {
        "id": "plan", "question": "Apply the migration?", "detail": "1. add column", "header": "DB",
        "options": [{"label": "Approve", "description": None}, {"label": "Revise", "description": None}],
        "multiSelect": False, "intent": {"kind": "plan-review", "approve": "Approve"},
    }  # fmt: skip
    model = ScriptedModel([call("ask_user_question", {"questions": [question]}, "c1")], [text("approved")])
    subject = Agent(name="planner", model=model, tools=[adapter.ask_user_question_tool(agent, timeout=10)])
    result = await adapter.run(subject, "plan", asker=agent, run_config=OFFLINE)
    assert result.final_output == "approved"
    assert json.loads(_outputs(model)["c1"]) == {"answers": [{"id": "plan", "selected": ["Approve"]}]}
    item = person.seen[0].questions[0]
    assert (item.intent, item.detail, item.header) == (PlanReviewIntent(approve="Approve"), "1. add column", "DB")
    schema = model.tools[0].params_json_schema  # what the model sees: intent is in it
    assert "intent" in schema["$defs"]["Question"]["properties"]


@pytest.mark.timeout(30)
async def test_an_error_is_returned_to_the_model_as_its_code(agent):
    question = {"id": "q", "question": "Go?", "detail": None, "header": None, "options": None,
                "multiSelect": False, "intent": None}  # fmt: skip
    model = ScriptedModel([call("ask_user_question", {"questions": [question]}, "c1")], [text("gave up")])
    subject = Agent(name="planner", model=model, tools=[adapter.ask_user_question_tool(agent, timeout=10)])
    await adapter.run(subject, "plan", asker=agent, run_config=OFFLINE)  # no provider
    assert json.loads(_outputs(model)["c1"])["code"] == "NO_PROVIDER"


@pytest.mark.timeout(30)
async def test_tool_approvals_route_through_the_broker(human, agent):
    ran: list[str] = []

    @function_tool(needs_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return f"deleted {path}"

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        by_id = {"c1": AskUserQuestionAnswerItem(id="c1", selected=("Approve",)),
                 "c2": AskUserQuestionAnswerItem(id="c2", selected=(), custom="keep the logs")}  # fmt: skip
        return AskUserQuestionAnswer(answers=tuple(by_id[q.id] for q in request.questions))

    person = await human(respond)
    model = ScriptedModel(
        [call("delete_file", {"path": "build/"}, "c1"), call("delete_file", {"path": "logs/"}, "c2")], [text("done")]
    )
    subject = Agent(name="cleaner", model=model, tools=[delete_file])
    result = await adapter.run(subject, "clean", asker=agent, run_config=OFFLINE)
    assert result.final_output == "done" and ran == ["build/"]
    (request,) = person.seen
    assert [q.question for q in request.questions] == [
        'Allow delete_file: `{"path": "build/"}`?',
        'Allow delete_file: `{"path": "logs/"}`?',
    ]
    outputs = _outputs(model)
    assert outputs["c1"] == "deleted build/"
    assert outputs["c2"] == "The user denied this call: keep the logs"
