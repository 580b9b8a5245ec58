"""Tool-call approvals as one batch of Approve / Deny questions; shared by the adapters."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from broker import AskUserQuestionAnswer, AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest

__all__ = ["APPROVE", "DENY", "Asker", "ToolCall", "Verdict", "approval_request", "verdicts"]

APPROVE: Final = "Approve"
DENY: Final = "Deny"
_SUMMARY_CHARS: Final = 200


class Asker(Protocol):
    """What the adapters ask through: a live ``broker.Agent`` (preferred) or a ``Broker``."""

    async def ask(
        self, request: AskUserQuestionRequest, *, abort: asyncio.Event | None = ..., timeout: float | None = ...
    ) -> AskUserQuestionAnswer: ...


@dataclass(frozen=True)
class ToolCall:
    """One call awaiting approval: its id (the question id), the tool and its arguments."""

    call_id: str
    tool_name: str
    args: Mapping[str, Any] | str


@dataclass(frozen=True)
class Verdict:
    """The human's decision on one call; ``message`` is for the model when denied."""

    approved: bool
    message: str


def _summary(args: Mapping[str, Any] | str) -> str:
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, sort_keys=True)
    flat = " ".join(text.split()).replace("`", "'")
    return flat if len(flat) <= _SUMMARY_CHARS else flat[: _SUMMARY_CHARS - 1] + "…"


def approval_request(calls: Iterable[ToolCall], *, header: str = "Tool approval") -> AskUserQuestionRequest:
    """One question per call, in order: "Allow delete_file: `{"path": "a"}`?" with Approve / Deny."""
    items = []
    for call in calls:
        args = call.args if isinstance(call.args, str) else json.dumps(call.args, ensure_ascii=False, indent=2)
        items.append(
            AskUserQuestionItem(
                id=call.call_id,
                question=f"Allow {call.tool_name}: `{_summary(call.args)}`?",
                header=header,
                detail=f"The agent wants to call **{call.tool_name}** with:\n\n```json\n{args}\n```",
                options=(
                    AskUserQuestionOption(label=APPROVE, description="let this call run"),
                    AskUserQuestionOption(label=DENY, description="block it (or type a note: the agent reads it)"),
                ),
            )
        )
    return AskUserQuestionRequest(questions=tuple(items))


def verdicts(answer: AskUserQuestionAnswer) -> dict[str, Verdict]:
    """Approve approves; Deny, a note ("Other": shown to the model) or a skip denies."""
    result = {}
    for item in answer.answers:
        if item.custom is not None:
            result[item.id] = Verdict(False, f"The user denied this call: {item.custom}")
        elif item.selected == (APPROVE,):
            result[item.id] = Verdict(True, "approved by the user")
        elif item.selected == (DENY,):
            result[item.id] = Verdict(False, "The user denied this call.")
        else:
            result[item.id] = Verdict(False, "The user skipped this approval; the call did not run.")
    return result
