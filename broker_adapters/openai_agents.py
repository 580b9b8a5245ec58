"""OpenAI Agents SDK: the ``ask_user_question`` tool, and tool approvals through the broker.

``ask_user_question_tool(agent)`` is a ``FunctionTool`` whose arguments are the seeds' full
request (intent and detail included: a plan review reaches the human as a plan card). For
tools created with ``needs_approval=True``, a run stops with ``result.interruptions``;
``approve(result, asker)`` asks the human about all of them in one request (Approve / Deny,
a note typed as "Other" denies and is the message the model reads) and returns the
``RunState`` to resume with; ``run(agent, input, asker=...)`` loops until no call waits.

Requires ``question-broker[openai-agents]``.
"""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, FunctionTool, Runner, RunResult, RunState, function_tool

from ._approvals import Asker, ToolCall, approval_request, verdicts
from .tool import DESCRIPTION, ask_user_question_function

__all__ = ["approve", "ask_user_question_tool", "run"]


def ask_user_question_tool(asker: Asker, *, timeout: float | None = 900.0) -> FunctionTool:
    """The tool the model calls to ask the human; ``asker`` is a live ``broker.Agent``."""
    return function_tool(
        ask_user_question_function(asker, timeout=timeout),
        name_override="ask_user_question",
        description_override=DESCRIPTION,
    )


def _arguments(raw: Any) -> dict[str, Any] | str:
    arguments = getattr(raw, "arguments", None)
    if arguments is None and isinstance(raw, dict):
        arguments = raw.get("arguments")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return {} if arguments is None else str(arguments)


async def approve(result: RunResult, asker: Asker, *, timeout: float | None = None) -> RunState[Any]:
    """Decide ``result.interruptions`` through the broker; resume with ``Runner.run(agent, state)``."""
    state: RunState[Any] = result.to_state()
    items = list(result.interruptions)
    calls = []
    for n, item in enumerate(items):
        raw = item.raw_item
        call_id = getattr(raw, "call_id", None) or (raw.get("call_id") if isinstance(raw, dict) else None)
        calls.append(ToolCall(str(call_id or f"call-{n}"), item.tool_name or "tool", _arguments(raw)))
    if not calls:
        return state
    decided = verdicts(await asker.ask(approval_request(calls), timeout=timeout))
    for item, call in zip(items, calls, strict=True):
        verdict = decided[call.call_id]
        if verdict.approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=verdict.message)
    return state


async def run(
    agent: Agent[Any], agent_input: str | list[Any], *, asker: Asker, timeout: float | None = None, **options: Any
) -> RunResult:
    """``Runner.run`` until no tool call waits for approval, asking each batch through the broker."""
    result = await Runner.run(agent, agent_input, **options)
    while result.interruptions:
        state = await approve(result, asker, timeout=timeout)
        result = await Runner.run(agent, state, **options)
    return result
