"""broker_adapters.openai_agents against the real SDK with a scripted fake Model; no network."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra is not installed (pip install -e '.[openai-agents]')")

from agents import Agent, ApplyPatchTool, RunConfig, ShellTool, Tool, function_tool
from openai.types.responses import ResponseFunctionShellToolCall
from openai.types.responses.response_apply_patch_tool_call import OperationUpdateFile, ResponseApplyPatchToolCall
from openai.types.responses.response_function_shell_tool_call import Action

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionRequest, PlanReviewIntent
from broker_adapters import openai_agents as adapter
from tests.adapters.killed_asker import answered_after_a_kill, approved
from tests.adapters.scripted_model import ScriptedModel, call, text

OFFLINE = RunConfig(tracing_disabled=True)


def cleaner(model: ScriptedModel, ran: list[str]) -> Agent[Any]:
    """An agent with one tool, delete_file, asked about before each call; ``ran`` gets each path it deleted."""

    @function_tool(needs_approval=True)
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return f"deleted {path}"

    return Agent(name="cleaner", model=model, tools=[delete_file])


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

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        by_id = {"c1": AskUserQuestionAnswerItem(id="c1", selected=("Approve",)),
                 "c2": AskUserQuestionAnswerItem(id="c2", selected=(), custom="keep the logs")}  # fmt: skip
        return AskUserQuestionAnswer(answers=tuple(by_id[q.id] for q in request.questions))

    person = await human(respond)
    model = ScriptedModel(
        [call("delete_file", {"path": "build/"}, "c1"), call("delete_file", {"path": "logs/"}, "c2")], [text("done")]
    )
    subject = cleaner(model, ran)
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


# -- shell and apply_patch, restarts ---------------------------------------------------------------------


@pytest.mark.timeout(30)
async def test_shell_and_apply_patch_approvals_show_the_command_and_the_patch(human, agent):
    ran: list[Any] = []

    async def executor(request: Any) -> str:
        ran.append(request)
        return "ok"

    class Editor:
        def create_file(self, operation: Any) -> None:
            ran.append(operation)

        def update_file(self, operation: Any) -> None:
            ran.append(operation)

        def delete_file(self, operation: Any) -> None:
            ran.append(operation)

    shell_call = ResponseFunctionShellToolCall(
        type="shell_call", id="sh1", call_id="s1", status="completed",
        action=Action(commands=["rm -rf build", "make"], timeout_ms=1000, max_output_length=100),
    )  # fmt: skip
    patch_call = ResponseApplyPatchToolCall(
        type="apply_patch_call", id="ap1", call_id="p1", status="completed",
        operation=OperationUpdateFile(type="update_file", path="app.py", diff="@@\n-x = 1\n+x = 2\n"),
    )  # fmt: skip

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        by_id = {"s1": AskUserQuestionAnswerItem(id="s1", selected=("Approve",)),
                 "p1": AskUserQuestionAnswerItem(id="p1", selected=("Deny",))}  # fmt: skip
        return AskUserQuestionAnswer(answers=tuple(by_id[q.id] for q in request.questions))

    person = await human(respond)
    model = ScriptedModel([shell_call, patch_call], [text("done")])
    tools: list[Tool] = [
        ShellTool(executor=executor, needs_approval=True),
        ApplyPatchTool(editor=Editor(), needs_approval=True),
    ]
    result = await adapter.run(Agent(name="dev", model=model, tools=tools), "build", asker=agent, run_config=OFFLINE)
    assert result.final_output == "done" and len(ran) == 1  # the shell ran, the patch did not
    shell, patch = person.seen[0].questions
    assert shell.question == "Allow shell: `rm -rf build; make`?"
    assert "```sh\nrm -rf build\nmake\n```" in (shell.detail or "")
    assert patch.question == "Allow apply_patch: `update_file app.py`?"
    assert "-x = 1\n+x = 2" in (patch.detail or "")


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_an_approval_survives_a_killed_asking_process(make_broker, redis_server, namespace, tmp_path):
    """A process killed while its card waits; a new one restores the saved RunState, asks under the same
    key, re-attaches to that card (no second one) and runs the approved call."""
    saved = tmp_path / "run-state.json"
    restart = "tests.adapters.openai_restart"
    restarted = {"asking": ["c1"]}
    last = await answered_after_a_kill(make_broker, redis_server.url, namespace, restart, saved, restarted, approved)
    assert last == {"output": "done: deleted build/"}


@pytest.mark.timeout(30)
async def test_an_edited_approval_runs_the_tool_with_the_edited_arguments(human, agent):
    """The SDK refuses a changed call under an approved id, so the edit goes back to the model as the
    rejection's message; its call with exactly the edited arguments is approved without a second card."""
    ran: list[str] = []

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        item = request.questions[0]
        assert item.editable is not None and item.editable.arguments == {"path": "build/"}
        schema = item.editable.schema
        assert schema is not None and schema["properties"]["path"]["type"] == "string"  # the tool's params schema
        edited = {"path": "build/cache"}
        return AskUserQuestionAnswer(
            answers=(AskUserQuestionAnswerItem(id=item.id, selected=("Approve",), edited=edited),)
        )

    person = await human(respond)
    model = ScriptedModel(
        [call("delete_file", {"path": "build/"}, "c1")],
        [call("delete_file", {"path": "build/cache"}, "c2")],  # the model follows the message
        [text("done")],
    )
    subject = cleaner(model, ran)
    result = await adapter.run(subject, "clean", asker=agent, run_config=OFFLINE)
    assert result.final_output == "done"
    assert ran == ["build/cache"]  # only the edited call ran
    assert len(person.seen) == 1  # the human was asked once
    told = [i["output"] for i in model.inputs[1] if i.get("type") == "function_call_output"]
    assert any('{"path":"build/cache"}' in str(output) for output in told)


@pytest.mark.timeout(30)
async def test_always_approve_is_written_back_to_the_run(human, agent):
    """ "Always approve" is the SDK's own ``approve(item, always_approve=True)``: the tool's later calls in
    this run go without another card."""
    ran: list[str] = []

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        item = request.questions[0]
        labels = [option.label for option in item.options or ()]
        assert labels == ["Approve", "Always approve", "Deny"]
        return AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id=item.id, selected=("Always approve",)),))

    person = await human(respond)
    model = ScriptedModel(
        [call("delete_file", {"path": "build/"}, "c1")],
        [call("delete_file", {"path": "logs/"}, "c2")],  # another call of the same tool, another turn
        [text("done")],
    )
    subject = cleaner(model, ran)
    result = await adapter.run(subject, "clean", asker=agent, run_config=OFFLINE)
    assert result.final_output == "done"
    assert ran == ["build/", "logs/"]
    assert len(person.seen) == 1  # the second call was not asked about
    options = person.seen[0].questions[0].options
    assert options is not None and "later calls" in str(options[1].description)


def _edit_then_approve(edited: dict[str, Any]) -> Any:
    """The first card approved with ``edited`` arguments; every later one approved as it stands."""
    answered: list[str] = []

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        item = request.questions[0]
        edit = None if answered else edited
        answered.append(item.id)
        return AskUserQuestionAnswer(
            answers=(AskUserQuestionAnswerItem(id=item.id, selected=("Approve",), edited=edit),)
        )

    return respond


@pytest.mark.timeout(30)
async def test_a_reissued_call_other_than_the_approved_edit_is_asked_again_saying_what_differed(human, agent):
    """A real model may not re-issue the call with exactly the edited arguments: its card says so."""
    ran: list[str] = []

    @function_tool(needs_approval=True)
    def delete_file(path: str, recursive: bool = False) -> str:
        """Delete a file."""
        ran.append(f"{path} {recursive}")
        return f"deleted {path}"

    person = await human(_edit_then_approve({"path": "build/cache", "recursive": False}))
    model = ScriptedModel(
        [call("delete_file", {"path": "build/", "recursive": False}, "c1")],
        [call("delete_file", {"path": "build/cache/", "recursive": True}, "c2")],  # not quite what was approved
        [text("done")],
    )
    result = await adapter.run(Agent(name="cleaner", model=model, tools=[delete_file]), "clean", asker=agent,
                               run_config=OFFLINE)  # fmt: skip
    assert result.final_output == "done" and ran == ["build/cache/ True"]
    assert len(person.seen) == 2  # asked again
    again = person.seen[1].questions[0].detail or ""
    assert "Asked again" in again and "approved with edited arguments" in again
    assert '`path`: approved `"build/cache"`, called with `"build/cache/"`' in again
    assert "`recursive`: approved `false`, called with `true`" in again
    assert "Asked again" not in (person.seen[0].questions[0].detail or "")


@pytest.mark.timeout(30)
async def test_an_approved_edit_lets_one_call_run_not_every_later_identical_one(human, agent):
    """One approval, one call (invariant 14): the model's second call with the edited arguments is asked about."""
    ran: list[str] = []

    person = await human(_edit_then_approve({"path": "build/cache"}))
    model = ScriptedModel(
        [call("delete_file", {"path": "build/"}, "c1")],
        [call("delete_file", {"path": "build/cache"}, "c2")],  # the edit, as approved: runs without a card
        [call("delete_file", {"path": "build/cache"}, "c3")],  # and once more: a new card
        [text("done")],
    )
    result = await adapter.run(cleaner(model, ran), "clean", asker=agent,
                               run_config=OFFLINE)  # fmt: skip
    assert result.final_output == "done" and ran == ["build/cache", "build/cache"]
    assert [q.questions[0].id for q in person.seen] == ["c1", "c3"]


@pytest.mark.timeout(30)
async def test_the_edits_own_call_in_a_batch_takes_it_and_the_other_call_is_asked_as_usual(human, agent):
    """The model re-issues the edited call beside another call of the tool: the exact one runs, and the other
    card does not claim to differ from an edit that got its call."""
    ran: list[str] = []

    person = await human(_edit_then_approve({"path": "build/cache"}))
    model = ScriptedModel(
        [call("delete_file", {"path": "build/"}, "c1")],
        [call("delete_file", {"path": "logs/"}, "c2"), call("delete_file", {"path": "build/cache"}, "c3")],
        [text("done")],
    )
    result = await adapter.run(cleaner(model, ran), "clean", asker=agent, run_config=OFFLINE)
    assert result.final_output == "done" and sorted(ran) == ["build/cache", "logs/"]
    assert [q.questions[0].id for q in person.seen] == ["c1", "c2"]
    assert "Asked again" not in (person.seen[1].questions[0].detail or "")
