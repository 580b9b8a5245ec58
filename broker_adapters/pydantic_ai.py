"""Pydantic AI: tools marked ``requires_approval=True`` approved or denied through the broker.

Pydantic AI ends a run with ``DeferredToolRequests`` when a tool needs approval (the agent's
``output_type`` must include it). ``approve(requests, asker)`` asks the human about every
call in one request (one Approve / Deny question per call, the arguments as detail) and
returns the ``DeferredToolResults`` to continue with: Approve runs the call; Deny, a
skipped question or a note typed as "Other" denies it (``ToolDenied``, the note is what
the model reads). ``run(agent, prompt, asker=...)`` loops run, approve, run until the
output is no longer a ``DeferredToolRequests``. Tools for external execution
(``requests.calls``) are left to the caller.

For a tool the model calls to ask the human, register
``broker_adapters.tool.ask_user_question_function(agent)`` with ``Agent(tools=[...])``.

Requires ``question-broker[pydantic-ai]``.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.run import AgentRunResult

from ._approvals import Asker, ToolCall, approval_request, verdicts

__all__ = ["approve", "run"]


async def approve(requests: DeferredToolRequests, asker: Asker, *, timeout: float | None = None) -> DeferredToolResults:
    """Ask the human about ``requests.approvals``; a ``UserQuestionError`` (timeout, ...) propagates."""
    results = DeferredToolResults()
    if not requests.approvals:
        return results
    calls = [ToolCall(part.tool_call_id, part.tool_name, part.args_as_dict()) for part in requests.approvals]
    answer = await asker.ask(approval_request(calls), timeout=timeout)
    for call_id, verdict in verdicts(answer).items():
        results.approvals[call_id] = True if verdict.approved else ToolDenied(verdict.message)
    return results


async def run(
    agent: AbstractAgent[Any, Any],
    user_prompt: str | None = None,
    *,
    asker: Asker,
    timeout: float | None = None,
    **options: Any,
) -> AgentRunResult[Any]:
    """``agent.run`` until no tool waits for approval, asking each batch through the broker."""
    result = await agent.run(user_prompt, **options)
    options.pop("message_history", None)
    while isinstance(result.output, DeferredToolRequests) and result.output.approvals:
        decided = await approve(result.output, asker, timeout=timeout)
        result = await agent.run(message_history=result.all_messages(), deferred_tool_results=decided, **options)
    return result
