"""Pydantic AI: deferred tool calls (approvals and questions) answered through the broker.

A run stops with ``DeferredToolRequests`` when a tool needs approval (``requires_approval=True``
or ``ApprovalRequired``), asks a question (``CallDeferred(kind='question')``) or runs outside
the agent (``CallDeferred()``, external tools). The human decides the first two here:

- ``decide(requests, asker)``: asks every approval and question at once (one Approve / Deny
  question per approval with its arguments and ``ApprovalRequired(metadata=...)``; each
  question as the tool asked it) and returns the ``DeferredToolResults`` for them. Deny, a
  skip or a note typed as "Other" denies (``ToolDenied``, the note is what the model reads);
  a question dismissed by the human is a ``ToolFailed`` the model sees, an approval dismissed
  a denial. Other ask errors (timeout, no provider) are raised: nothing was decided. The results
  name who answered each call (``answered_by``) as the broker verified it from the answer's seal.
- ``handler(asker)``: the same, inside the run, for ``HandleDeferredToolCalls``: the run goes
  on without stopping; on an ask error the calls stay unresolved and the run ends with them
  as its ``DeferredToolRequests`` output, to continue later.
- ``run(agent, prompt, asker=...)``: ``agent.run`` until no approval or question waits. A run
  that also waits on external calls is returned as it stopped unless ``external`` (your
  function giving their results) is passed: the next run needs every result at once.

Each approval offers the call's arguments for editing: approved with an edit, the call runs with
the edited arguments (``ToolApproved(override_args=...)``), checked against the tool's JSON Schema
(``schemas=``; ``run`` reads them from the agent, ``tool_schemas(agent)`` for the others).

``key=`` (a conversation id, say) makes every ask keyed by it and the calls' ids: a process
restarted with the same message history and pending calls re-attaches to the same cards.

Requires ``question-broker[pydantic-ai]``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import RunContext, ToolApproved

from broker import AskUserQuestionOption, UserQuestionError
from broker.errors import ASK_CANCELLED

from ._approvals import Asker, ToolCall, Verdict, ask_approvals

__all__ = ["approve", "decide", "handler", "run", "tool_schemas"]

External = Callable[[DeferredToolRequests], Awaitable[DeferredToolResults]]
Schemas = Mapping[str, Mapping[str, Any]]


def tool_schemas(agent: AbstractAgent[Any, Any]) -> dict[str, dict[str, Any]]:
    """The JSON Schema of each function tool's arguments, by tool name (what an edit must satisfy).

    Tools of other toolsets (MCP servers, say) list theirs only in a run: their edits go unchecked
    by schema here, and Pydantic AI still validates ``override_args`` before the tool runs.
    """
    found: dict[str, dict[str, Any]] = {}
    for toolset in getattr(agent, "toolsets", ()):
        tools = getattr(toolset, "tools", None)
        if not isinstance(tools, Mapping):
            continue
        for name, tool in tools.items():
            tool_def = getattr(tool, "tool_def", None)
            schema = getattr(tool_def, "parameters_json_schema", None)
            if isinstance(schema, dict):
                found[str(name)] = schema
    return found


def _metadata_note(metadata: dict[str, Any] | None) -> tuple[str, ...]:
    if not metadata:
        return ()
    text = json.dumps(metadata, ensure_ascii=False, indent=2, default=str)
    return (f"Why it needs approval (the tool's metadata):\n\n```json\n{text}\n```",)


def _question_call(part: ToolCallPart, metadata: dict[str, Any] | None) -> ToolCall:
    """A question the tool deferred: its ``question`` argument asked as is, ``options`` offered when given."""
    args = part.args_as_dict()
    labels = [o if isinstance(o, str) else o.get("label") for o in args.get("options") or () if o]
    options = tuple(AskUserQuestionOption(label=str(label)) for label in dict.fromkeys(labels) if label)
    text = args.get("question")
    return ToolCall(
        part.tool_call_id,
        part.tool_name,
        args,
        notes=_metadata_note(metadata),
        options=options,  # () when none: a free-text question
        question=text if isinstance(text, str) and text.strip() else None,
    )


def _question_result(verdict: Verdict) -> Any:
    if verdict.note is not None:
        return verdict.note
    if verdict.choice is not None:
        return verdict.choice
    return ToolFailed("The user skipped the question.")


async def decide(
    requests: DeferredToolRequests,
    asker: Asker,
    *,
    timeout: float | None = None,
    key: str | None = None,
    schemas: Schemas | None = None,
) -> DeferredToolResults:
    """The human's results for ``requests``' approvals and questions (external calls are left out).

    ``schemas``: each tool's argument schema by name (``tool_schemas(agent)``), which an edit must satisfy.
    """
    questions = [part for part in requests.calls if requests.kind(part.tool_call_id) == "question"]
    metadata = requests.metadata
    schemas = schemas or {}
    calls = [
        ToolCall(
            p.tool_call_id, p.tool_name, p.args_as_dict(), notes=_metadata_note(metadata.get(p.tool_call_id)),
            editable=True, schema=schemas.get(p.tool_name),
        )
        for p in requests.approvals
    ] + [_question_call(p, metadata.get(p.tool_call_id)) for p in questions]  # fmt: skip
    results = DeferredToolResults()
    if not calls:
        return results
    try:
        decided = await ask_approvals(asker, calls, timeout=timeout, key=f"pydantic-ai:{key}" if key else None)
    except UserQuestionError as error:
        if error.code != ASK_CANCELLED:
            raise
        reason = f"The user dismissed the question: {error.message}"
        for part in requests.approvals:
            results.approvals[part.tool_call_id] = ToolDenied(reason)
        for part in questions:
            results.calls[part.tool_call_id] = ToolFailed(reason)
        return results
    for part in requests.approvals:
        verdict = decided[part.tool_call_id]
        results.approvals[part.tool_call_id] = (
            ToolApproved(override_args=verdict.edited) if verdict.approved else ToolDenied(verdict.message)
        )
    for part in questions:
        results.calls[part.tool_call_id] = _question_result(decided[part.tool_call_id])
    for part in [*requests.approvals, *questions]:
        by = decided[part.tool_call_id].by
        if by:  # as the broker verified it: Pydantic AI does not check who answers
            results.answered_by[part.tool_call_id] = by
    return results


approve = decide
"""``decide``, by its earlier name."""


def handler(
    asker: Asker, *, timeout: float | None = None, key: str | None = None, schemas: Schemas | None = None
) -> Callable[[RunContext[Any], DeferredToolRequests], Awaitable[DeferredToolResults | None]]:
    """For ``HandleDeferredToolCalls(handler=handler(me))``: approvals and questions decided in the run.

    An ask that fails (timeout, no provider, Redis unreachable) leaves the calls unresolved, so the
    run ends with them as ``DeferredToolRequests`` (put it in ``output_type``) rather than raising.
    """

    async def handle(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults | None:
        try:
            results = await decide(requests, asker, timeout=timeout, key=key, schemas=schemas)
        except UserQuestionError:
            return None
        return results if results.approvals or results.calls else None

    return handle


def _waits_on_human(output: Any) -> bool:
    return isinstance(output, DeferredToolRequests) and (
        bool(output.approvals) or any(output.kind(c.tool_call_id) == "question" for c in output.calls)
    )


async def run(
    agent: AbstractAgent[Any, Any],
    user_prompt: str | None = None,
    *,
    asker: Asker,
    timeout: float | None = None,
    key: str | None = None,
    external: External | None = None,
    **options: Any,
) -> AgentRunResult[Any]:
    """``agent.run`` until no approval or question waits, asking each batch through the broker.

    A run that stops on external calls too is returned as it stopped (nothing asked), unless
    ``external`` gives their results: Pydantic AI takes the results of every pending call at once.
    """
    result = await agent.run(user_prompt, **options)
    options.pop("message_history", None)
    schemas = tool_schemas(agent)
    while _waits_on_human(result.output):
        requests: DeferredToolRequests = result.output
        externals = [c for c in requests.calls if requests.kind(c.tool_call_id) == "external"]
        if externals and external is None:
            return result
        decided = await decide(requests, asker, timeout=timeout, key=key, schemas=schemas)
        if externals and external is not None:
            decided.update(await external(requests))
        result = await agent.run(message_history=result.all_messages(), deferred_tool_results=decided, **options)
    return result
