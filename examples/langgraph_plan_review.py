"""A LangGraph graph whose review step asks a human through question-broker (no LLM needed).

    pip install 'question-broker[langgraph]'
    qbroker provide          # in another terminal: answer there (or qbroker web, qbroker auto)
    python examples/langgraph_plan_review.py

QBROKER_REDIS_URL and QBROKER_NAMESPACE say where to ask (default redis://localhost:6379/0, default).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from broker import AskUserQuestionItem, AskUserQuestionOption, Broker, PlanReviewIntent
from broker_adapters.langgraph import ask_human, run_graph


class State(TypedDict, total=False):
    plan: str
    approved: bool
    note: str


def draft(state: State) -> dict[str, Any]:
    return {"plan": "# Migrate the orders table\n1. add column `region`\n2. backfill\n3. drop `zone`"}


def review(state: State) -> dict[str, Any]:
    answer = ask_human(  # pauses the graph; run_graph asks the human and resumes it
        AskUserQuestionItem(
            id="plan",
            question="Apply this migration plan?",
            detail=state["plan"],
            options=(AskUserQuestionOption(label="Approve"), AskUserQuestionOption(label="Request changes")),
            intent=PlanReviewIntent(approve="Approve"),
        )
    )
    item = answer.answers[0]
    return {"approved": item.selected == ("Approve",), "note": item.custom or ""}


def build() -> Any:
    graph = StateGraph(State)
    graph.add_node("draft", draft)
    graph.add_node("review", review)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "review")
    graph.add_edge("review", END)
    return graph.compile(checkpointer=InMemorySaver())


async def main() -> None:
    url = os.environ.get("QBROKER_REDIS_URL", "redis://localhost:6379/0")
    namespace = os.environ.get("QBROKER_NAMESPACE", "default")
    trusted_keys = os.environ.get("QBROKER_TRUSTED_KEYS", "")  # the providers' public keys (qbroker keys new)
    async with (
        Broker(url, namespace=namespace, trusted_keys=trusted_keys) as broker,
        broker.agent("langgraph-example") as me,
    ):
        state = await run_graph(build(), {}, {"configurable": {"thread_id": "migration-1"}}, asker=me, timeout=600)
    print("approved" if state["approved"] else f"not approved {state['note']}".strip())


if __name__ == "__main__":
    asyncio.run(main())
