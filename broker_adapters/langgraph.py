"""LangGraph: a graph's ``interrupt()`` answered through the broker, resumed with ``Command``.

Inside a node, ``ask_human(request)`` pauses the graph (``interrupt``) with the request's
wire JSON and, once resumed, returns the human's ``AskUserQuestionAnswer`` (or raises the
``UserQuestionError`` the ask ended with, so the node can route on its code). Outside,
``run_graph(graph, input, config, asker=agent)`` runs the graph (it needs a checkpointer),
asks every pending interrupt through the broker (all at once when parallel nodes
interrupt together), resumes with ``Command(resume={interrupt_id: value})`` and repeats
until the graph ends. It also reads the interrupts other code raises:

- a text (``interrupt("Which region?")``): a free-text question, resumed with the text;
- langchain's ``HumanInTheLoopMiddleware`` (``create_agent``), batched
  (``{action_requests, review_configs}``, resumed with ``{decisions: [...]}``) or per call
  (``{type: "tool_approval", ...}`` with its ``response_schema``, resumed with one decision):
  one Approve / Reject question per call, only the decisions the tool allows offered;
- Agent Inbox's ``HumanInterrupt`` (a list of ``{action_request, config, description}``,
  resumed with a list of ``{type, args}``).

Every ask is keyed by its interrupt's id, which LangGraph keeps across runs of the same
checkpoint: ``run_graph(graph, None, config, ...)`` after a restart (with a checkpointer that
outlives the process) asks the same interrupts again and re-attaches to their cards, or
collects the answers given meanwhile.

Requires ``question-broker[langgraph]``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec
from langgraph.types import Command, Interrupt, interrupt
from typing_extensions import TypedDict  # pydantic (LangGraph checks resume values with it) needs it on 3.11

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    UserQuestionError,
)
from broker.errors import BAD_ANSWER, BAD_REQUEST, ErrorPayload
from broker.types import convert_answer, convert_request

from ._approvals import Asker, ToolCall, Verdict, ask_approvals

__all__ = ["TEXT_QUESTION_ID", "ask_human", "resume_value", "run_graph"]

TEXT_QUESTION_ID: Final = "answer"
_DECISIONS: Final = ("approve", "edit", "reject", "respond")
_LABELS: Final = {"approve": "Approve", "reject": "Reject", "accept": "Accept", "ignore": "Ignore"}
_HINTS: Final = {
    "approve": "let this call run",
    "accept": "let it go ahead",
    "reject": "block it (or type a note: the agent reads it)",
    "ignore": "skip this step",
}
_SKIPPED: Final = "The user skipped this approval; the call did not run."


class _Answered(TypedDict):
    answer: dict[str, Any]


class _Failed(TypedDict):
    error: dict[str, Any]


_RESUMED: Final[Any] = _Answered | _Failed
"""What ``ask_human``'s interrupt is resumed with; LangGraph checks a resume value against it."""


def ask_human(request: AskUserQuestionRequest | AskUserQuestionItem) -> AskUserQuestionAnswer:
    """In a node: pause for the human's answer (``run_graph`` asks it through the broker).

    Like any ``interrupt()``, the node runs again from its start when resumed: keep what
    comes before this call free of side effects.
    """
    if isinstance(request, AskUserQuestionItem):
        request = AskUserQuestionRequest(questions=(request,))
    resumed = interrupt(msgspec.to_builtins(request), response_schema=_RESUMED)
    if isinstance(resumed, Mapping) and "error" in resumed:
        raise UserQuestionError.from_payload(msgspec.convert(resumed["error"], ErrorPayload))
    if isinstance(resumed, Mapping) and "answer" in resumed:
        return convert_answer(resumed["answer"])
    raise UserQuestionError(f"resumed with {resumed!r}, not an answer", BAD_REQUEST)


def _request_for(value: Any) -> AskUserQuestionRequest:
    if isinstance(value, str):
        return convert_request({"questions": [{"id": TEXT_QUESTION_ID, "question": value}]})
    try:
        return convert_request(value)
    except msgspec.ValidationError as error:
        raise UserQuestionError(f"the interrupt's request is not valid: {error}", BAD_REQUEST) from error


# -- approvals: HumanInTheLoopMiddleware and Agent Inbox ---------------------------------------------


def _options(kinds: Sequence[str]) -> tuple[AskUserQuestionOption, ...]:
    """An option per decision a click can make; respond (and reject's reason) come as a typed note.

    An edit is made with Approve (the edited arguments go with it), so a tool that allows edit
    but not approve still gets Approve: approving unchanged is an edit to the same arguments.
    """
    if "edit" in kinds and "approve" not in kinds:
        kinds = ["approve", *kinds]
    return tuple(AskUserQuestionOption(label=_LABELS[k], description=_HINTS[k]) for k in kinds if k in _LABELS)


def _args_schema(schema: Any) -> dict[str, Any] | None:
    """The tool's argument schema inside a per-call ``response_schema``'s edit branch, when it has one."""
    if not isinstance(schema, Mapping):
        return None
    defs = schema.get("$defs", {})
    edited = defs.get("EditedAction") if isinstance(defs, Mapping) else None
    args = edited.get("properties", {}).get("args") if isinstance(edited, Mapping) else None
    if not isinstance(args, Mapping):
        return None
    # The tool's schema is a $ref into the response schema's $defs: carried along, it stands alone.
    return {**args, "$defs": dict(defs)} if "$ref" in json.dumps(args) else dict(args)


def _allowed(schema: Any) -> list[str]:
    """The decision types a per-call interrupt's ``response_schema`` (JSON Schema) admits."""
    if not isinstance(schema, Mapping):
        return list(_DECISIONS)
    mapping = schema.get("discriminator", {}).get("mapping")
    if isinstance(mapping, Mapping):
        return [k for k in mapping if k in _DECISIONS]
    const = schema.get("properties", {}).get("type", {}).get("const")
    return [const] if const in _DECISIONS else list(_DECISIONS)


def _hitl_calls(
    actions: Sequence[Mapping[str, Any]],
    allowed: Sequence[Sequence[str]],
    ids: Sequence[str],
    schemas: Sequence[Mapping[str, Any] | None] | None = None,
) -> list[ToolCall]:
    calls = []
    for n, (call_id, action, kinds) in enumerate(zip(ids, actions, allowed, strict=True)):
        notes = [str(action["description"])] if action.get("description") else []
        if "respond" in kinds and "reject" not in kinds:
            notes.append("*Type a reply to answer in the tool's place: the call does not run.*")
        calls.append(
            ToolCall(
                call_id, str(action.get("name", "tool")), action.get("args", {}), notes=tuple(notes),
                options=_options(kinds), editable="edit" in kinds, schema=schemas[n] if schemas else None,
            )
        )  # fmt: skip
    return calls


def _decision(verdict: Verdict, kinds: Sequence[str], call: ToolCall) -> dict[str, Any]:
    """The middleware's decision for one verdict, within the kinds the tool allows."""
    if verdict.choice == "Approve" and "edit" in kinds and (verdict.edited is not None or "approve" not in kinds):
        args = verdict.edited if verdict.edited is not None else call.args
        return {"type": "edit", "edited_action": {"name": call.tool_name, "args": args}}
    if verdict.choice == "Approve" and "approve" in kinds:
        return {"type": "approve"}
    if verdict.choice == "Reject" and "reject" in kinds:
        return {"type": "reject"}
    if verdict.note is not None and "reject" in kinds:
        return {"type": "reject", "message": verdict.note}
    if verdict.note is not None and "respond" in kinds:
        return {"type": "respond", "message": verdict.note}
    if verdict.skipped and "reject" in kinds:
        return {"type": "reject", "message": _SKIPPED}
    raise UserQuestionError(f"the human's answer is none of the decisions this call allows ({kinds})", BAD_ANSWER)


def _inbox_kinds(config: Mapping[str, Any]) -> list[str]:
    kinds = [k for k, flag in (("accept", "allow_accept"), ("ignore", "allow_ignore")) if config.get(flag)]
    return kinds if "accept" in kinds or not config.get("allow_edit") else ["accept", *kinds]


def _inbox_response(verdict: Verdict, config: Mapping[str, Any], call: ToolCall) -> dict[str, Any]:
    if verdict.choice == "Accept" and config.get("allow_edit") and (verdict.edited or not config.get("allow_accept")):
        args = verdict.edited if verdict.edited is not None else call.args
        return {"type": "edit", "args": {"action": call.tool_name, "args": args}}
    if verdict.choice == "Accept" and config.get("allow_accept"):
        return {"type": "accept", "args": None}
    if verdict.choice == "Ignore" and config.get("allow_ignore"):
        return {"type": "ignore", "args": None}
    if verdict.note is not None and config.get("allow_respond"):
        return {"type": "response", "args": verdict.note}
    if verdict.skipped and config.get("allow_ignore"):
        return {"type": "ignore", "args": None}
    raise UserQuestionError("the human's answer is none of the responses this interrupt allows", BAD_ANSWER)


def _is_inbox(value: Any) -> bool:
    items = value if isinstance(value, list | tuple) else [value]
    return bool(items) and all(isinstance(i, Mapping) and "action_request" in i and "config" in i for i in items)


async def _inbox(value: Any, asker: Asker, key: str, timeout: float | None) -> Any:
    items: list[Mapping[str, Any]] = list(value) if isinstance(value, list | tuple) else [value]
    calls = []
    for n, item in enumerate(items):
        action, config = item["action_request"], item["config"]
        notes = [str(item["description"])] if item.get("description") else []
        if config.get("allow_respond"):
            notes.append("*Type a reply to answer in the tool's place.*")
        options = _options(_inbox_kinds(config))
        calls.append(ToolCall(f"action-{n}", str(action.get("action", "action")), action.get("args", {}),
                              notes=tuple(notes), options=options, editable=bool(config.get("allow_edit")),
                              approve="Accept"))  # fmt: skip
    decided = await ask_approvals(asker, calls, timeout=timeout, key=key, header="Review")
    responses = [_inbox_response(decided[c.call_id], i["config"], c) for c, i in zip(calls, items, strict=True)]
    return responses if isinstance(value, list | tuple) else responses[0]


async def _hitl_batched(value: Mapping[str, Any], asker: Asker, key: str, timeout: float | None) -> Any:
    actions = list(value["action_requests"])
    configs = list(value["review_configs"])
    allowed = [list(config.get("allowed_decisions", _DECISIONS)) for config in configs]
    schemas = [config.get("args_schema") if isinstance(config.get("args_schema"), Mapping) else None
               for config in configs]  # fmt: skip
    calls = _hitl_calls(actions, allowed, [f"action-{n}" for n in range(len(actions))], schemas)
    decided = await ask_approvals(asker, calls, timeout=timeout, key=key)
    return {"decisions": [_decision(decided[c.call_id], k, c) for c, k in zip(calls, allowed, strict=True)]}


async def _hitl_per_call(pending: Interrupt, asker: Asker, key: str, timeout: float | None) -> Any:
    value = pending.value
    kinds = _allowed(pending.response_schema)
    schema = _args_schema(pending.response_schema)
    (call,) = _hitl_calls([value], [kinds], [str(value.get("tool_call_id") or "call")], [schema])
    decided = await ask_approvals(asker, [call], timeout=timeout, key=key)
    return _decision(decided[call.call_id], kinds, call)


# -- resuming -----------------------------------------------------------------------------------------


async def resume_value(value: Any, asker: Asker, *, timeout: float | None = None, key: str | None = None) -> Any:
    """What to resume one interrupt with, asked through the broker (``key``: a keyed ask).

    A request (from ``ask_human``): ``{"answer": ...}`` or ``{"error": {name, code, message}}``,
    which ``ask_human`` turns back into the answer or the error. A text: the answer's text.
    An approval (``HumanInTheLoopMiddleware``, Agent Inbox): the framework's decisions. For
    all but ``ask_human``'s requests, errors are raised here and the graph stays paused.
    ``run_graph`` passes the whole ``Interrupt`` (a per-call approval needs its ``response_schema``).
    """
    pending = value if isinstance(value, Interrupt) else None
    value = pending.value if pending is not None else value
    ask_key = key if key is not None else f"langgraph:{pending.id}" if pending is not None else None
    if isinstance(value, Mapping) and "action_requests" in value and "review_configs" in value:
        return await _hitl_batched(value, asker, ask_key or "langgraph", timeout)
    if isinstance(value, Mapping) and value.get("type") == "tool_approval":
        return await _hitl_per_call(pending or Interrupt(value), asker, ask_key or "langgraph", timeout)
    if _is_inbox(value):
        return await _inbox(value, asker, ask_key or "langgraph", timeout)
    if isinstance(value, str):
        request = _request_for(value)
        item = (await asker.ask(request, timeout=timeout, key=ask_key)).answers[0]
        return item.custom if item.custom is not None else ", ".join(item.selected)
    if not (isinstance(value, Mapping) and "questions" in value):
        shown = json.dumps(value, default=str)[:200]
        raise UserQuestionError(
            "an interrupt value must be a request ({questions: [...]}, see ask_human), a text, a"
            f" HumanInTheLoopMiddleware or Agent Inbox request, not {shown}",
            BAD_REQUEST,
        )
    request = _request_for(value)
    try:
        answer = await asker.ask(request, timeout=timeout, key=ask_key)
    except UserQuestionError as error:
        return {"error": error.to_dict()}
    return {"answer": msgspec.to_builtins(answer)}


async def run_graph(graph: Any, graph_input: Any, config: Any, *, asker: Asker, timeout: float | None = None) -> Any:
    """Run ``graph`` (compiled with a checkpointer) to its end, answering its interrupts through the broker.

    Returns the final state, as ``graph.ainvoke`` does. ``timeout`` bounds each ask.
    ``graph_input=None`` continues a paused thread: after a restart, its interrupts are
    asked again under the same keys, so they re-attach to the cards already shown.
    """
    result = await graph.ainvoke(graph_input, config)
    while isinstance(result, Mapping) and (interrupts := result.get("__interrupt__")):
        pending: list[Interrupt] = list(interrupts)
        try:
            async with asyncio.TaskGroup() as group:
                asks = [group.create_task(resume_value(i, asker, timeout=timeout)) for i in pending]
        except* UserQuestionError as failed:  # an ask failed: the graph stays paused, resumable later
            raise failed.exceptions[0] from None
        resume = {i.id: task.result() for i, task in zip(pending, asks, strict=True)}
        result = await graph.ainvoke(Command(resume=resume), config)
    return result
