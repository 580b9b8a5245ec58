"""LangGraph approvals the way langchain's create_agent asks them: HumanInTheLoopMiddleware (batched and per
call) and Agent Inbox interrupts, answered through a real provider; the model is a scripted fake chat model."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, TypedDict

import pytest

pytest.importorskip("langchain", reason="langchain is not installed (pip install -e '.[dev]')")

from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionRequest, Attachment
from broker_adapters.langgraph import run_graph
from tests.adapters.killed_asker import answered_after_a_kill, approved_with_path


class FakeChat(GenericFakeChatModel):
    """Replays scripted AI messages; tools are bound by create_agent and ignored here."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _calls(*paths: str) -> AIMessage:
    return AIMessage(
        content="", tool_calls=[{"name": "delete_file", "args": {"path": p}, "id": f"c-{p}"} for p in paths]
    )


def _agent(ran: list[str], turns: list[AIMessage], **middleware: Any) -> Any:
    @tool
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return f"deleted {path}"

    @tool
    def ask_colleague(question: str) -> str:
        """Ask a colleague."""
        ran.append(f"asked {question}")
        return "nobody answered"

    return create_agent(
        FakeChat(messages=iter(turns)),
        tools=[delete_file, ask_colleague],
        middleware=[HumanInTheLoopMiddleware(**middleware)],
        checkpointer=InMemorySaver(),
    )


def _by_path(**answers: tuple[tuple[str, ...], str | None]):
    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        items = []
        for item in request.questions:
            path = next(p for p in answers if f'"path": "{p}"' in (item.detail or ""))
            selected, custom = answers[path]
            items.append(AskUserQuestionAnswerItem(id=item.id, selected=selected, custom=custom))
        return AskUserQuestionAnswer(answers=tuple(items))

    return respond


def _tool_messages(state: Any) -> dict[str, str]:
    return {m.tool_call_id: str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)}


PROMPT = {"messages": [{"role": "user", "content": "clean up"}]}


@pytest.mark.timeout(30)
async def test_batched_hitl_is_asked_and_each_decision_reaches_the_agent(human, agent):
    ran: list[str] = []
    person = await human(_by_path(a=(("Approve",), None), b=((), "keep b, it is the backup")))
    graph = _agent(ran, [_calls("a", "b"), AIMessage(content="done")], interrupt_on={"delete_file": True})
    state = await run_graph(graph, PROMPT, {"configurable": {"thread_id": "b1"}}, asker=agent)
    assert ran == ["a"]
    messages = _tool_messages(state)
    assert messages["c-a"] == "deleted a" and "keep b, it is the backup" in messages["c-b"]
    (request,) = person.seen  # one card for the model turn's two calls
    first = request.questions[0]
    assert [o.label for o in first.options or ()] == ["Approve", "Reject"]
    assert "Tool execution requires approval" in (first.detail or "")  # the middleware's description
    assert first.question == 'Allow delete_file: `{"path": "a"}`?'


@pytest.mark.timeout(30)
async def test_per_call_hitl_offers_only_the_decisions_the_tool_allows(human, agent):
    ran: list[str] = []

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        item = request.questions[0]
        if "ask_colleague" in item.question:  # respond only: a free-text card, the reply stands in for the tool
            assert item.options is None
            return AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id=item.id, selected=(), custom="42"),))
        assert [o.label for o in item.options or ()] == ["Approve", "Reject"]
        return AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id=item.id, selected=("Reject",)),))

    person = await human(respond)
    turns = [
        AIMessage(
            content="",
            tool_calls=[
                {"name": "delete_file", "args": {"path": "a"}, "id": "c1"},
                {"name": "ask_colleague", "args": {"question": "answer?"}, "id": "c2"},
            ],
        ),
        AIMessage(content="done"),
    ]
    graph = _agent(
        ran,
        turns,
        interrupt_on={
            "delete_file": {"allowed_decisions": ["approve", "reject"]},
            "ask_colleague": {"allowed_decisions": ["respond"]},
        },
        interrupt_mode="per_call",
    )
    state = await run_graph(graph, PROMPT, {"configurable": {"thread_id": "p1"}}, asker=agent)
    assert ran == []
    messages = _tool_messages(state)
    assert messages["c2"] == "42" and "User rejected the tool call for `delete_file`" in messages["c1"]
    assert len(person.seen) == 2


@pytest.mark.timeout(30)
async def test_more_calls_than_a_card_holds_are_split_not_refused(human, agent):
    ran: list[str] = []
    person = await human(
        lambda request: AskUserQuestionAnswer(
            answers=tuple(AskUserQuestionAnswerItem(id=q.id, selected=("Approve",)) for q in request.questions)
        )
    )
    paths = [f"f{n}" for n in range(25)]
    graph = _agent(ran, [_calls(*paths), AIMessage(content="done")], interrupt_on={"delete_file": True})
    await run_graph(graph, PROMPT, {"configurable": {"thread_id": "m1"}}, asker=agent)
    assert sorted(ran) == sorted(paths)
    assert sorted(len(r.questions) for r in person.seen) == [5, 20]


@pytest.mark.timeout(30)
async def test_a_cut_argument_says_how_much_was_shown_and_is_attached(human, agent, make_broker):
    ran: list[str] = []
    person = await human(
        lambda request: AskUserQuestionAnswer(
            answers=tuple(AskUserQuestionAnswerItem(id=q.id, selected=("Approve",)) for q in request.questions)
        )
    )
    huge = "x" * 300_000  # over the broker's 200 000 characters of detail
    graph = _agent(ran, [_calls(huge), AIMessage(content="done")], interrupt_on={"delete_file": True})
    await run_graph(graph, PROMPT, {"configurable": {"thread_id": "h1"}}, asker=agent)
    assert ran == [huge]  # the call ran with its whole argument
    detail = person.seen[0].questions[0].detail or ""
    whole = json.dumps({"path": huge}, indent=2).encode()
    digest = hashlib.sha256(whole).hexdigest()
    assert f"of {len(whole):,} bytes (SHA-256 `{digest}`)" in detail
    assert len(detail) < 80_000
    # the whole text one click away: named by the question, kept by the broker
    assert person.seen[0].questions[0].attachment == Attachment(sha256=digest, size=len(whole))
    reader = await make_broker()
    assert (await reader.attachment(digest) or "").encode() == whole


class Inbox(TypedDict, total=False):
    response: Any


def _inbox_graph(config: dict[str, bool]) -> Any:
    def review(state: Inbox) -> dict[str, Any]:
        request = {
            "action_request": {"action": "send_email", "args": {"to": "ops@example.com"}},
            "config": config,
            "description": "Send the outage report?",
        }
        return {"response": interrupt([request])[0]}

    graph = StateGraph(Inbox)
    graph.add_node("review", review)
    graph.add_edge(START, "review")
    graph.add_edge("review", END)
    return graph.compile(checkpointer=InMemorySaver())


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("selected", "custom", "expected"),
    [
        pytest.param(("Accept",), None, {"type": "accept", "args": None}, id="accept"),
        pytest.param((), "send it tomorrow", {"type": "response", "args": "send it tomorrow"}, id="respond"),
        pytest.param((), None, {"type": "ignore", "args": None}, id="skip-ignores"),
    ],
)
async def test_agent_inbox_interrupts_get_human_responses(human, agent, selected, custom, expected):
    person = await human(
        lambda request: AskUserQuestionAnswer(
            answers=(AskUserQuestionAnswerItem(id=request.questions[0].id, selected=selected, custom=custom),)
        )
    )
    config = {"allow_accept": True, "allow_ignore": True, "allow_respond": True, "allow_edit": False}
    state = await run_graph(_inbox_graph(config), {}, {"configurable": {"thread_id": "i1"}}, asker=agent)
    assert state["response"] == expected
    item = person.seen[0].questions[0]
    assert [o.label for o in item.options or ()] == ["Accept", "Ignore"]
    assert "Send the outage report?" in (item.detail or "") and "ops@example.com" in (item.detail or "")


@pytest.mark.timeout(30)
async def test_a_rerun_after_the_asker_stopped_reattaches_to_the_same_card(make_broker, agent):
    ran: list[str] = []
    graph = _agent(ran, [_calls("a"), AIMessage(content="done")], interrupt_on={"delete_file": True})
    config = {"configurable": {"thread_id": "r1"}}
    async with (await make_broker()).provider("test-human") as provider:
        seen = aiter(provider)
        first = asyncio.create_task(run_graph(graph, PROMPT, config, asker=agent))
        pending = await asyncio.wait_for(anext(seen), 10)
        first.cancel()  # the asking task stops; its keyed ask stays on the human's screen
        with pytest.raises(asyncio.CancelledError):
            await first
        again = asyncio.create_task(run_graph(graph, None, config, asker=agent))  # the thread continues
        await asyncio.sleep(0.5)
        assert not again.done()
        await pending.answer(
            AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id="action-0", selected=("Approve",)),)),
            by="test-human",
        )
        state = await asyncio.wait_for(again, 10)
        with pytest.raises(TimeoutError):  # no second card was shown
            await asyncio.wait_for(anext(seen), 0.5)
    assert ran == ["a"] and _tool_messages(state)["c-a"] == "deleted a"


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_an_approval_survives_a_killed_asking_process(make_broker, redis_server, namespace, tmp_path):
    """A process killed while its card waits; a new one continues the thread from the checkpoint on
    disk, re-attaches to that card (no second one) and runs the tool with the human's edit."""
    restart, edit = "tests.adapters.langgraph_restart", approved_with_path("build/cache")
    last = await answered_after_a_kill(
        make_broker, redis_server.url, namespace, restart, tmp_path, {"restarted": True}, edit
    )
    output = last["output"]
    assert output.startswith("done: ") and output.endswith("deleted build/cache")  # the human's edit ran


def _edit_to(path: str):
    """Approve every call with its path edited to ``path`` (the card must offer the edit)."""

    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        items = []
        for item in request.questions:
            assert item.editable is not None and item.editable.approve == "Approve"
            edited = {**item.editable.arguments, "path": path}
            items.append(AskUserQuestionAnswerItem(id=item.id, selected=("Approve",), edited=edited))
        return AskUserQuestionAnswer(answers=tuple(items))

    return respond


async def _run_edited(
    human: Any, agent: Any, name: str, decisions: list[str], *, thread: str, **middleware: Any
) -> tuple[list[str], Any, Any]:
    """The agent deletes file ``name`` under HITL allowing ``decisions``; the person approves the call with its path
    edited to ``name``.bak. What the tool ran on, the person, and the graph's end state."""
    ran: list[str] = []
    person = await human(_edit_to(f"{name}.bak"))
    interrupt_on = {"delete_file": {"allowed_decisions": decisions}}
    graph = _agent(ran, [_calls(name), AIMessage(content="done")], interrupt_on=interrupt_on, **middleware)
    state = await run_graph(graph, PROMPT, {"configurable": {"thread_id": thread}}, asker=agent)
    return ran, person, state


@pytest.mark.timeout(30)
async def test_batched_hitl_edit_runs_the_tool_with_the_edited_arguments(human, agent):
    ran, person, state = await _run_edited(human, agent, "a", ["approve", "edit", "reject"], thread="e1")
    assert ran == ["a.bak"]  # the edited arguments reached the tool
    assert _tool_messages(state)["c-a"].endswith("deleted a.bak")
    assert "a human reviewer replaced this tool call" in _tool_messages(state)["c-a"]  # the middleware's own edit
    item = person.seen[0].questions[0]
    assert item.editable is not None and item.editable.arguments == {"path": "a"}


@pytest.mark.timeout(30)
async def test_per_call_hitl_edit_carries_the_tools_schema_and_runs_the_edit(human, agent):
    no_plain_approve = ["edit", "reject"]
    ran, person, state = await _run_edited(human, agent, "b", no_plain_approve, thread="e2", interrupt_mode="per_call")
    assert ran == ["b.bak"] and _tool_messages(state)["c-b"].endswith("deleted b.bak")
    item = person.seen[0].questions[0]
    assert [o.label for o in item.options or ()] == ["Approve", "Reject"]
    assert item.editable is not None and item.editable.schema is not None
    schema = item.editable.schema  # the tool's own schema, standing alone (its $refs carried along)
    assert schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]["properties"]["path"]["type"] == "string"
    assert "not offered" not in (item.detail or "")


@pytest.mark.timeout(30)
async def test_agent_inbox_edit_is_an_edit_response(human, agent):
    def respond(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        item = request.questions[0]
        assert item.editable is not None and item.editable.approve == "Accept"
        edited = {"to": "oncall@example.com"}
        return AskUserQuestionAnswer(
            answers=(AskUserQuestionAnswerItem(id=item.id, selected=("Accept",), edited=edited),)
        )

    await human(respond)
    config = {"allow_accept": True, "allow_ignore": True, "allow_respond": True, "allow_edit": True}
    state = await run_graph(_inbox_graph(config), {}, {"configurable": {"thread_id": "i2"}}, asker=agent)
    assert state["response"] == {"type": "edit", "args": {"action": "send_email", "args": {"to": "oncall@example.com"}}}
