"""broker_adapters.pydantic_ai against a real Agent with TestModel / FunctionModel; no model calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed (pip install -e '.[pydantic-ai]')")

from pydantic_ai import (
    Agent,
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    Tool,
    ToolDenied,
)
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.messages import (
    DeferredToolResultsEvent,
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionRequest, PlanReviewIntent
from broker_adapters import pydantic_ai as adapter
from broker_adapters.tool import ask_user_question_function
from tests.adapters.killed_asker import answered_after_a_kill, approved_with_path
from tests.helpers import plan_review_arguments


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
    call = plan_review_arguments("Apply the migration plan?", "1. add column", ("Approve", "Revise"), "Approve")

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


# -- mixed runs, questions, metadata, cancel, the in-run path, many calls ----------------------------------


def _returns(result: Any) -> dict[str, Any]:
    return {
        part.tool_call_id: part.content
        for message in result.all_messages()
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart)
    }


def _mixed_agent(ran: list[str], **options: Any) -> Agent[None, str | DeferredToolRequests]:
    """One model turn calls a tool needing approval (with metadata), an external tool and a question tool."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("drop_table", {"name": "users"}, tool_call_id="t-drop"),
                    ToolCallPart("lookup", {"what": "owner"}, tool_call_id="t-lookup"),
                    ToolCallPart(
                        "ask_user", {"question": "Which region?", "options": ["eu", "us"]}, tool_call_id="t-ask"
                    ),
                ]
            )
        return ModelResponse(parts=[TextPart("done")])

    subject: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model), output_type=[str, DeferredToolRequests], **options
    )

    @subject.tool
    def drop_table(ctx: RunContext[None], name: str) -> str:
        """Drop a table."""
        if not ctx.tool_call_approved:
            raise ApprovalRequired(metadata={"reason": "production database", "rows": 1200})
        ran.append(f"drop {name}")
        return f"dropped {name}"

    @subject.tool_plain
    def lookup(what: str) -> str:
        """Looked up by another service."""
        raise CallDeferred()

    @subject.tool_plain
    def ask_user(question: str, options: list[str]) -> str:
        """Ask the user."""
        raise CallDeferred(kind="question")

    return subject


def _answer_mixed(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
    by_id = {"t-drop": AskUserQuestionAnswerItem(id="t-drop", selected=("Approve",)),
             "t-ask": AskUserQuestionAnswerItem(id="t-ask", selected=("eu",))}  # fmt: skip
    return AskUserQuestionAnswer(answers=tuple(by_id[q.id] for q in request.questions))


@pytest.mark.timeout(30)
async def test_a_mixed_run_gets_approvals_questions_and_external_results_together(human, agent):
    person = await human(_answer_mixed)
    ran: list[str] = []

    async def external(requests: DeferredToolRequests) -> DeferredToolResults:
        return DeferredToolResults(calls={"t-lookup": "team-db"})

    result = await adapter.run(_mixed_agent(ran), "go", asker=agent, external=external)
    assert result.output == "done" and ran == ["drop users"]
    assert _returns(result) == {"t-drop": "dropped users", "t-lookup": "team-db", "t-ask": "eu"}
    (request,) = person.seen
    drop, ask = request.questions
    assert "production database" in (drop.detail or "") and '"rows": 1200' in (drop.detail or "")
    assert ask.question == "Which region?"  # the question itself, not "Allow ask_user: ..."
    assert [o.label for o in ask.options or ()] == ["eu", "us"]


@pytest.mark.timeout(30)
async def test_a_mixed_run_without_an_external_handler_stops_rather_than_crashing(human, agent):
    person = await human(_answer_mixed)
    result = await adapter.run(_mixed_agent([]), "go", asker=agent)
    assert isinstance(result.output, DeferredToolRequests) and person.seen == []
    decided = await adapter.decide(result.output, agent)  # the caller adds the external results and resumes
    decided.calls["t-lookup"] = "team-db"
    resumed = await _mixed_agent([]).run(message_history=result.all_messages(), deferred_tool_results=decided)
    assert resumed.output == "done"


@pytest.mark.timeout(30)
async def test_a_dismissed_question_is_a_denial_the_model_reads_not_an_exception(human, agent):
    await human(lambda request: "not today")
    ran: list[str] = []

    async def external(requests: DeferredToolRequests) -> DeferredToolResults:
        return DeferredToolResults(calls={"t-lookup": "team-db"})

    result = await adapter.run(_mixed_agent(ran), "go", asker=agent, external=external)
    assert result.output == "done" and ran == []
    returns = _returns(result)
    assert "dismissed" in str(returns["t-drop"]) and "not today" in str(returns["t-drop"])


@pytest.mark.timeout(30)
async def test_the_in_run_path_decides_without_stopping_the_run(human, agent):
    await human(_answer_mixed)
    ran: list[str] = []

    async def external(ctx: RunContext[None], requests: DeferredToolRequests) -> DeferredToolResults:
        return DeferredToolResults(calls={"t-lookup": "team-db"})

    subject = _mixed_agent(
        ran,
        capabilities=[
            HandleDeferredToolCalls(handler=adapter.handler(agent)),
            HandleDeferredToolCalls(handler=external),
        ],
    )
    result = await subject.run("go")
    assert result.output == "done" and ran == ["drop users"]
    assert _returns(result)["t-ask"] == "eu"


@pytest.mark.timeout(30)
async def test_the_results_name_who_answered_as_the_broker_verified_it(human, agent):
    """``DeferredToolResults.answered_by``: the provider's ``by``, from the seal the asker verified."""
    await human(_answer_mixed)
    result = await adapter.run(_mixed_agent([]), "go", asker=agent)  # stops: an external call waits too
    assert isinstance(result.output, DeferredToolRequests)
    decided = await adapter.decide(result.output, agent)
    assert decided.answered_by == {"t-drop": "test-human", "t-ask": "test-human"}


@pytest.mark.timeout(30)
async def test_the_in_run_path_reports_who_answered(human, agent):
    """Pydantic AI reports a handler's ``answered_by`` in its ``DeferredToolResultsEvent``."""
    await human(_answer_mixed)
    reported: dict[str, str] = {}

    async def external(ctx: RunContext[None], requests: DeferredToolRequests) -> DeferredToolResults:
        return DeferredToolResults(calls={"t-lookup": "team-db"})

    subject = _mixed_agent(
        [],
        capabilities=[
            HandleDeferredToolCalls(handler=adapter.handler(agent)),
            HandleDeferredToolCalls(handler=external),
        ],
    )
    async with subject.iter("go") as run:
        async for node in run:
            if Agent.is_call_tools_node(node):
                async with node.stream(run.ctx) as events:
                    async for event in events:
                        if isinstance(event, DeferredToolResultsEvent):
                            reported.update(event.results.answered_by)
    assert run.result is not None and run.result.output == "done"
    assert reported == {"t-drop": "test-human", "t-ask": "test-human"}


@pytest.mark.timeout(30)
async def test_the_in_run_path_leaves_the_calls_pending_when_nobody_can_answer(agent):
    subject = _mixed_agent([], capabilities=[HandleDeferredToolCalls(handler=adapter.handler(agent))])
    result = await subject.run("go")  # no provider: NO_PROVIDER
    assert isinstance(result.output, DeferredToolRequests) and len(result.output.approvals) == 1


@pytest.mark.timeout(30)
async def test_more_approvals_than_a_card_holds_are_split(human, agent):
    person = await human(
        lambda request: AskUserQuestionAnswer(
            answers=tuple(AskUserQuestionAnswerItem(id=q.id, selected=("Approve",)) for q in request.questions)
        )
    )
    ran: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("touch", {"n": n}, tool_call_id=f"t{n}") for n in range(23)])
        return ModelResponse(parts=[TextPart("done")])

    subject: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(model), output_type=[str, DeferredToolRequests]
    )

    @subject.tool_plain(requires_approval=True)
    def touch(n: int) -> str:
        """Touch a file."""
        ran.append(str(n))
        return "ok"

    result = await adapter.run(subject, "go", asker=agent)
    assert result.output == "done" and len(ran) == 23
    assert sorted(len(r.questions) for r in person.seen) == [3, 20]


def _edit(**by_tool: dict[str, Any]):
    """Approve every call, its arguments edited per tool (the card must offer the edit)."""

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        items = []
        for item in request.questions:
            tool = item.question.split(":")[0].removeprefix("Allow ")
            assert item.editable is not None and item.editable.approve == "Approve"
            edited = {**item.editable.arguments, **by_tool[tool]} if tool in by_tool else None
            items.append(AskUserQuestionAnswerItem(id=item.id, selected=("Approve",), edited=edited))
        return AskUserQuestionAnswer(answers=tuple(items))

    return respond


@pytest.mark.timeout(30)
async def test_an_edited_approval_runs_the_tool_with_the_edited_arguments(human, agent):
    person = await human(_edit(delete_file={"path": "a.bak"}))
    subject = _agent()
    await adapter.run(subject, "clean up", asker=agent)
    assert sorted(subject.ran) == ["delete a.bak", "drop a"]  # type: ignore[attr-defined]  # override_args
    delete = person.seen[0].questions[0]
    assert delete.editable is not None and delete.editable.arguments == {"path": "a"}
    schema = delete.editable.schema  # the tool's own schema, read from the agent
    assert schema is not None and schema["properties"]["path"]["type"] == "string" and schema["required"] == ["path"]


@pytest.mark.timeout(30)
async def test_an_edit_in_the_run_reaches_the_tool(human, agent):
    """HandleDeferredToolCalls: the edit made while the run waits is the call that runs."""
    await human(_edit(delete_file={"path": "b.bak"}, drop_table={"name": "tmp"}))
    subject = _agent()
    handle = adapter.handler(agent, schemas=adapter.tool_schemas(subject))
    await subject.run("clean up", capabilities=[HandleDeferredToolCalls(handler=handle)])
    assert sorted(subject.ran) == ["delete b.bak", "drop tmp"]  # type: ignore[attr-defined]


# -- restarts ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_an_approval_survives_a_killed_asking_process(make_broker, redis_server, namespace, tmp_path):
    """A process killed while its card waits; a new one resumes from the saved message history with the
    same key, re-attaches to that card (no second one) and runs the tool with the human's answer."""
    saved = tmp_path / "messages.json"
    restart, edit = "tests.adapters.pydantic_restart", approved_with_path("build/cache")
    last = await answered_after_a_kill(
        make_broker, redis_server.url, namespace, restart, saved, {"asking": ["c1"]}, edit
    )
    assert last == {"output": "done: deleted build/cache"}  # the human's edit ran
