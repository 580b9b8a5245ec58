"""OpenAI Agents SDK: the ``ask_user_question`` tool, and tool approvals through the broker.

``ask_user_question_tool(agent)`` is a ``FunctionTool`` whose arguments are the seeds' full
request (intent and detail included: a plan review reaches the human as a plan card). For
tools created with ``needs_approval=True``, a run stops with ``result.interruptions``;
``approve(result, asker)`` asks the human about all of them in one request (Approve / Deny,
a note typed as "Other" denies and is the message the model reads) and returns the
``RunState`` to resume with; ``run(agent, input, asker=...)`` loops until no call waits. The
SDK's own item fields are read (``call_id``, ``arguments``, ``qualified_name``); shell calls are
shown as their commands and apply_patch calls as their diffs (both live in the raw item, not in
``arguments``). With ``key=``, an approval outlives the process: save ``state.to_string()``,
and after a restart ``approve(RunState.from_string(...), me, key=...)`` re-attaches to its card.

"Always approve" (a third option beside Approve / Deny) is the SDK's own ``approve(item,
always_approve=True)``: the tool's later calls by that agent in this run, and in a ``RunState``
restored from it, run without another card. The broker's remembered decisions are the other,
namespace-wide way (a human ticks "remember" on the web page; they answer identical cards).

Edits: the SDK cannot run an approved call with other arguments (it refuses a call id whose
arguments changed: "Model reused a tool call ID for a different invocation"). The closest it
offers is a rejection whose message the model reads: an edited approval rejects the call with
the edited arguments in the message, asking the model to call the tool again with exactly those,
and ``run`` (or ``approve(..., edits=...)``) approves that call, once, without asking again, since
the human approved exactly it. A model that calls with anything else is asked about as usual, and
that card says the call differs from the approved edit, and where (a real model may not copy the
arguments exactly).

Requires ``question-broker[openai-agents]``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from typing import Any

from agents import Agent, FunctionTool, Runner, RunResult, RunState, ToolApprovalItem, function_tool

from broker import AskUserQuestionOption

from ._approvals import APPROVE, DENY, Asker, ToolCall, ask_approvals
from .tool import DESCRIPTION, ask_user_question_function

__all__ = ["ALWAYS_APPROVE", "approve", "ask_user_question_tool", "run"]

ALWAYS_APPROVE = "Always approve"
_OPTIONS = (
    AskUserQuestionOption(label=APPROVE, description="let this call run"),
    AskUserQuestionOption(
        label=ALWAYS_APPROVE, description="let this call run, and this tool's later calls in this run without asking"
    ),
    AskUserQuestionOption(label=DENY, description="block it (or type a note: the agent reads it)"),
)


def ask_user_question_tool(asker: Asker, *, timeout: float | None = 900.0) -> FunctionTool:
    """The tool the model calls to ask the human; ``asker`` is a live ``broker.Agent``."""
    return function_tool(
        ask_user_question_function(asker, timeout=timeout),
        name_override="ask_user_question",
        description_override=DESCRIPTION,
    )


def _plain(raw: Any) -> dict[str, Any]:
    """The raw item as plain data: the SDK keeps a pydantic model or a dict (after a RunState round trip)."""
    if isinstance(raw, dict):
        return raw
    dump = getattr(raw, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else {}


def _arguments(item: ToolApprovalItem) -> dict[str, Any] | str:
    text = item.arguments  # the SDK's own reading: arguments, params or input, as JSON text
    if text is None:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if isinstance(parsed, dict) else text


def _shell(action: dict[str, Any]) -> tuple[str, str] | None:
    """A shell call's commands (hosted ``shell``: ``commands``; ``local_shell``: one argv)."""
    if isinstance(action.get("commands"), list):
        commands = [str(c) for c in action["commands"]]
    elif isinstance(action.get("command"), list):
        commands = [shlex.join(str(c) for c in action["command"])]
    else:
        return None
    return "; ".join(commands), "\n".join(commands)


def _patch(operations: list[dict[str, Any]]) -> tuple[str, str]:
    """An apply_patch call's operations: ``update_file a.py`` and each diff under its file."""
    summary = ", ".join(f"{o.get('type', 'edit')} {o.get('path', '?')}" for o in operations)
    blocks = [f"--- {o.get('type', 'edit')} {o.get('path', '?')}\n{o.get('diff') or ''}".rstrip() for o in operations]
    return summary, "\n".join(blocks)


Edits = set[tuple[str, str]]
"""(tool name, arguments as canonical JSON) of calls the human approved as edited"""


def _canonical(args: Any) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _edited_message(name: str, edited: dict[str, Any]) -> str:
    return (
        f"The user approved this call with edited arguments; it did not run as proposed. Call {name} again "
        f"with exactly these arguments (they are approved): {_canonical(edited)}"
    )


def _shown(value: Any) -> str:
    """A value as compact JSON on one line, cut to 200 characters, that cannot close a code span."""
    text = _canonical(value).replace("`", "'")
    return text if len(text) <= 200 else text[:199] + "…"


def _differences(approved: Any, called: Mapping[str, Any] | str) -> list[str]:
    """Where ``called`` differs from the ``approved`` edit, one line per argument (or one for the whole)."""
    if not isinstance(approved, dict) or not isinstance(called, Mapping):
        return [f"the arguments: approved `{_shown(approved)}`, called with `{_shown(called)}`"]
    lines = []
    for name in sorted(set(approved) | set(called)):
        if name in approved and name in called and _canonical(approved[name]) == _canonical(called[name]):
            continue
        was = f"approved `{_shown(approved[name])}`" if name in approved else "not in the approved edit"
        now = f"called with `{_shown(called[name])}`" if name in called else "left out"
        shown_name = str(name).replace("`", "'")[:80]
        lines.append(f"`{shown_name}`: {was}, {now}")
    return lines


def _asked_again(call: ToolCall, edits: Edits) -> ToolCall:
    """``call``, saying where it differs from the edit the human approved of its tool, if one waits for it."""
    approved = [json.loads(args) for name, args in edits if name == call.tool_name]
    if not approved:
        return call
    closest = min(approved, key=lambda edit: (len(_differences(edit, call.args)), _canonical(edit)))
    note = (
        f"**Asked again:** a call of {call.tool_name} was approved with edited arguments, to run when the model "
        "calls it with exactly those; this call's arguments differ from that edit, so it is asked about anew. "
        "It differs in:\n\n" + "\n".join(f"- {line}" for line in _differences(closest, call.args))
    )
    return dataclasses.replace(call, notes=(*call.notes, note))


def _call(n: int, item: ToolApprovalItem) -> ToolCall:
    """One approval as a question; shell commands and patches shown as such, not as their JSON."""
    raw = _plain(item.raw_item)
    call_id = item.call_id or f"call-{n}"
    name = item.qualified_name or item.name or str(raw.get("type") or "tool")
    action = raw.get("action")
    if isinstance(action, dict) and (shell := _shell(action)) is not None:
        summary, commands = shell
        return ToolCall(call_id, name, action, summary=summary, body=commands, body_language="sh", options=_OPTIONS)
    operations = raw.get("operations") or ([raw["operation"]] if isinstance(raw.get("operation"), dict) else None)
    if operations:
        summary, diff = _patch(operations)
        return ToolCall(call_id, name, {"operations": operations}, summary=summary, body=diff, options=_OPTIONS)
    arguments = _arguments(item)
    editable = isinstance(arguments, dict)
    return ToolCall(call_id, name, arguments, editable=editable, schema=_schema(item), options=_OPTIONS)


def _schema(item: ToolApprovalItem) -> dict[str, Any] | None:
    """The function tool's ``params_json_schema`` (what the model was given), found on the asking agent."""
    agent = getattr(item, "agent", None)
    for tool in getattr(agent, "tools", None) or ():
        if isinstance(tool, FunctionTool) and tool.name == item.name:
            return dict(tool.params_json_schema)
    return None


def _interruptions(pending: RunResult | RunState[Any]) -> tuple[RunState[Any], list[ToolApprovalItem]]:
    if isinstance(pending, RunState):
        return pending, list(pending.get_interruptions())
    return pending.to_state(), list(pending.interruptions)


async def approve(
    pending: RunResult | RunState[Any],
    asker: Asker,
    *,
    timeout: float | None = None,
    key: str | None = None,
    edits: Edits | None = None,
) -> RunState[Any]:
    """Decide the pending approvals through the broker; resume with ``Runner.run(agent, state)``.

    ``pending`` is a ``RunResult`` with ``interruptions`` or a ``RunState`` (``RunState.from_string``
    after a restart). ``key`` (the conversation's id, say) makes each card a keyed ask named by it
    and the calls' ids: a process that saved ``state.to_string()``, died and asks again from it
    re-attaches to the cards already shown, or collects the answers given meanwhile.

    ``edits``: a set this call adds the human's edited approvals to, and approves calls from
    without asking (the model calling again with exactly the edited arguments: each edit approves
    one call, and is then taken out); ``run`` keeps one. A call of an edited tool with other
    arguments is asked about, its card saying where it differs from the edit.
    """
    state, items = _interruptions(pending)
    edits = edits if edits is not None else set()
    calls = [_call(n, item) for n, item in enumerate(items)]
    asking = []
    for item, call in zip(items, calls, strict=True):
        edit = (call.tool_name, _canonical(call.args))
        if edit in edits:
            edits.discard(edit)  # one approval, one call
            state.approve(item)  # what the human approved, edited, on an earlier card
        else:
            asking.append((item, call))
    # Only then: an edit whose own call came in this batch waits for no other call.
    asking = [(item, _asked_again(call, edits)) for item, call in asking]
    if not asking:
        return state
    ask_key = f"openai-agents:{key}" if key else None
    decided = await ask_approvals(asker, [call for _, call in asking], timeout=timeout, key=ask_key)
    for item, call in asking:
        verdict = decided[call.call_id]
        if verdict.approved and verdict.edited is not None and verdict.edited != call.args:
            edits.add((call.tool_name, _canonical(verdict.edited)))
            state.reject(item, rejection_message=_edited_message(call.tool_name, verdict.edited))
        elif verdict.approved:
            state.approve(item)
        elif verdict.choice == ALWAYS_APPROVE:
            state.approve(item, always_approve=True)
        else:
            state.reject(item, rejection_message=verdict.message)
    return state


async def run(
    agent: Agent[Any],
    agent_input: str | list[Any] | RunState[Any],
    *,
    asker: Asker,
    timeout: float | None = None,
    key: str | None = None,
    **options: Any,
) -> RunResult:
    """``Runner.run`` until no tool call waits for approval, asking each batch through the broker.

    ``agent_input`` may be a ``RunState`` with pending approvals (restored after a restart).
    """
    edits: Edits = set()
    if isinstance(agent_input, RunState) and agent_input.get_interruptions():
        agent_input = await approve(agent_input, asker, timeout=timeout, key=key, edits=edits)
    result = await Runner.run(agent, agent_input, **options)
    while result.interruptions:
        state = await approve(result, asker, timeout=timeout, key=key, edits=edits)
        result = await Runner.run(agent, state, **options)
    return result
