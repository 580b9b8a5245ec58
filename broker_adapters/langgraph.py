"""LangGraph: a graph's ``interrupt()`` answered through the broker, resumed with ``Command``.

Inside a node, ``ask_human(request)`` pauses the graph (``interrupt``) with the request's
wire JSON and, once resumed, returns the human's ``AskUserQuestionAnswer`` (or raises the
``UserQuestionError`` the ask ended with, so the node can route on its code). Outside,
``run_graph(graph, input, config, asker=agent)`` runs the graph (it needs a checkpointer),
asks every pending interrupt through the broker (all at once when parallel nodes
interrupt together), resumes with ``Command(resume={interrupt_id: value})`` and repeats
until the graph ends. A plain ``interrupt("text?")`` works too: it becomes a free-text
question and is resumed with the text (or the chosen label).

Requires ``question-broker[langgraph]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

import msgspec
from langgraph.types import Command, Interrupt, interrupt

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionRequest,
    UserQuestionError,
)
from broker.errors import BAD_REQUEST, ErrorPayload
from broker.types import convert_answer, convert_request

from ._approvals import Asker

__all__ = ["TEXT_QUESTION_ID", "ask_human", "resume_value", "run_graph"]

TEXT_QUESTION_ID: Final = "answer"


def ask_human(request: AskUserQuestionRequest | AskUserQuestionItem) -> AskUserQuestionAnswer:
    """In a node: pause for the human's answer (``run_graph`` asks it through the broker).

    Like any ``interrupt()``, the node runs again from its start when resumed: keep what
    comes before this call free of side effects.
    """
    if isinstance(request, AskUserQuestionItem):
        request = AskUserQuestionRequest(questions=(request,))
    resumed = interrupt(msgspec.to_builtins(request))
    if isinstance(resumed, Mapping) and "error" in resumed:
        raise UserQuestionError.from_payload(msgspec.convert(resumed["error"], ErrorPayload))
    if isinstance(resumed, Mapping) and "answer" in resumed:
        return convert_answer(resumed["answer"])
    raise UserQuestionError(f"resumed with {resumed!r}, not an answer", BAD_REQUEST)


def _request_for(value: Any) -> AskUserQuestionRequest:
    if isinstance(value, str):
        return convert_request({"questions": [{"id": TEXT_QUESTION_ID, "question": value}]})
    if isinstance(value, Mapping) and "questions" in value:
        try:
            return convert_request(value)
        except msgspec.ValidationError as error:
            raise UserQuestionError(f"the interrupt's request is not valid: {error}", BAD_REQUEST) from error
    raise UserQuestionError(
        f"an interrupt value must be a request ({{questions: [...]}}, see ask_human) or a text, not {value!r}",
        BAD_REQUEST,
    )


async def resume_value(value: Any, asker: Asker, *, timeout: float | None = None) -> Any:
    """What to resume one interrupt with, asked through the broker.

    A request (from ``ask_human``): ``{"answer": ...}`` or ``{"error": {name, code, message}}``,
    which ``ask_human`` turns back into the answer or the error. A text: the answer's text;
    its errors are raised here.
    """
    request = _request_for(value)
    if isinstance(value, str):
        item = (await asker.ask(request, timeout=timeout)).answers[0]
        return item.custom if item.custom is not None else ", ".join(item.selected)
    try:
        answer = await asker.ask(request, timeout=timeout)
    except UserQuestionError as error:
        return {"error": error.to_dict()}
    return {"answer": msgspec.to_builtins(answer)}


async def run_graph(graph: Any, graph_input: Any, config: Any, *, asker: Asker, timeout: float | None = None) -> Any:
    """Run ``graph`` (compiled with a checkpointer) to its end, answering its interrupts through the broker.

    Returns the final state, as ``graph.ainvoke`` does. ``timeout`` bounds each ask.
    """
    result = await graph.ainvoke(graph_input, config)
    while isinstance(result, Mapping) and (interrupts := result.get("__interrupt__")):
        pending: list[Interrupt] = list(interrupts)
        try:
            async with asyncio.TaskGroup() as group:
                asks = [group.create_task(resume_value(i.value, asker, timeout=timeout)) for i in pending]
        except* UserQuestionError as failed:  # a text interrupt's ask failed: the graph stays paused
            raise failed.exceptions[0] from None
        resume = {i.id: task.result() for i, task in zip(pending, asks, strict=True)}
        result = await graph.ainvoke(Command(resume=resume), config)
    return result
