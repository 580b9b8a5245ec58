"""broker_adapters.langgraph against a real StateGraph with a checkpointer; no LLM."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest

pytest.importorskip("langgraph", reason="the langgraph extra is not installed (pip install -e '.[langgraph]')")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    PlanReviewIntent,
    UserQuestionError,
)
from broker_adapters.langgraph import ask_human, run_graph


class State(TypedDict, total=False):
    plan: str
    verdict: str
    colour: str
    note: str


def review(state: State) -> dict[str, Any]:
    item = AskUserQuestionItem(
        id="plan",
        question="Apply this plan?",
        detail=state["plan"],
        options=(AskUserQuestionOption(label="Approve"), AskUserQuestionOption(label="Revise")),
        intent=PlanReviewIntent(approve="Approve"),
    )
    try:
        answer = ask_human(item)
    except UserQuestionError as error:
        return {"verdict": error.code}
    return {"verdict": answer.answers[0].selected[0]}


def colour(state: State) -> dict[str, Any]:
    return {"colour": interrupt("Which colour?")}


def _graph() -> Any:
    graph = StateGraph(State)
    graph.add_node("review", review)
    graph.add_node("colour", colour)
    graph.add_edge(START, "review")
    graph.add_edge(START, "colour")  # both interrupt in the same step: asked at once
    graph.add_edge("review", END)
    graph.add_edge("colour", END)
    return graph.compile(checkpointer=InMemorySaver())


def _reply(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
    item = request.questions[0]
    if item.id == "plan":
        return AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id="plan", selected=("Approve",)),))
    return AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id=item.id, selected=(), custom="teal"),))


@pytest.mark.timeout(30)
async def test_interrupts_are_asked_through_the_broker_and_resumed(human, agent):
    person = await human(_reply)
    state = await run_graph(
        _graph(), {"plan": "# Plan\n1. migrate"}, {"configurable": {"thread_id": "t1"}}, asker=agent
    )
    assert (state["verdict"], state["colour"]) == ("Approve", "teal")
    asked = {r.questions[0].id: r for r in person.seen}
    plan = asked["plan"].questions[0]
    assert plan.intent == PlanReviewIntent(approve="Approve") and plan.detail == "# Plan\n1. migrate"
    assert asked["plan"].agent == "adapter-test"
    assert asked["answer"].questions[0].question == "Which colour?"


@pytest.mark.timeout(30)
async def test_an_ask_error_reaches_the_node_as_its_code(human, agent):
    def cancel_plan(request: AskUserQuestionRequest) -> AskUserQuestionAnswer | str:
        return "not now" if request.questions[0].id == "plan" else _reply(request)

    await human(cancel_plan)
    state = await run_graph(_graph(), {"plan": "p"}, {"configurable": {"thread_id": "t2"}}, asker=agent)
    assert state["verdict"] == "ASK_CANCELLED"


@pytest.mark.timeout(30)
async def test_a_text_interrupt_that_fails_leaves_the_graph_paused(make_broker, agent):
    graph = _graph()
    config = {"configurable": {"thread_id": "t3"}}
    with pytest.raises(UserQuestionError) as failed:
        await run_graph(graph, {"plan": "p"}, config, asker=agent)  # no provider at all
    assert failed.value.code == "NO_PROVIDER"
    assert (await graph.aget_state(config)).next  # still paused: resumable later


@pytest.mark.timeout(30)
async def test_ask_human_states_what_it_must_be_resumed_with(agent):
    graph = _graph()
    result = await graph.ainvoke({"plan": "p"}, {"configurable": {"thread_id": "t4"}})
    schemas = {i.value.get("questions", [{}])[0].get("id") if isinstance(i.value, dict) else "text": i.response_schema
               for i in result["__interrupt__"]}  # fmt: skip
    assert schemas["text"] is None  # a plain interrupt("...") says nothing
    assert "answer" in str(schemas["plan"]) and "error" in str(schemas["plan"])
    with pytest.raises(Exception, match="validation error"):  # LangGraph checks a resume value against it
        await graph.ainvoke(
            Command(resume={i.id: "yes" for i in result["__interrupt__"]}), {"configurable": {"thread_id": "t4"}}
        )
