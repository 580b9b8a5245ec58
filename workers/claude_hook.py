"""The engine of ``qbroker claude-hook``: a Claude Code tool call becomes an Allow / Deny question.

Input (stdin): Claude Code's ``PreToolUse`` payload, ``{session_id, transcript_path, cwd,
permission_mode, hook_event_name, tool_name, tool_input, tool_use_id}``. Output (stdout):
``{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": ...,
"permissionDecisionReason": ...}}``, exit status 0. The mapping:

- the human picks Allow: ``allow``; Deny: ``deny``; types a note ("Other"): ``deny`` with the
  note as the reason (Claude reads it, so "use `make clean` instead" steers it);
- the human (or a rule) cancels the question (``ASK_CANCELLED``): ``deny`` with its reason;
- nobody can answer (``NO_PROVIDER``, ``ASK_TIMED_OUT``, ``BROKER_UNAVAILABLE``) or the payload
  is not one we can ask about: ``ask`` (Claude Code's own prompt), or ``deny`` with
  ``--on-unavailable deny``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec
from redis.exceptions import RedisError

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    UserQuestionError,
)
from broker.errors import ASK_CANCELLED, BROKER_UNAVAILABLE

from .settings import Settings

__all__ = ["ALLOW", "DENY", "Decision", "decide", "hook", "hook_output", "question_for"]

ALLOW: Final = "Allow"
DENY: Final = "Deny"
QUESTION_ID: Final = "permission"
_SUMMARY_CHARS: Final = 200
_DETAIL_CHARS: Final = 20_000

Decision = Literal["allow", "deny", "ask"]

# The input field that says what a built-in tool is about to touch.
_SUBJECT: Final[Mapping[str, str]] = {
    "Bash": "command",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "Write": "file_path",
    "Read": "file_path",
    "NotebookEdit": "notebook_path",
    "WebFetch": "url",
    "WebSearch": "query",
    "Glob": "pattern",
    "Grep": "pattern",
    "Task": "description",
}


class HookPayload(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a PreToolUse payload this hook reads (others are ignored)."""

    tool_name: str
    tool_input: dict[str, Any] = {}
    tool_use_id: str | None = None
    session_id: str | None = None
    cwd: str | None = None
    hook_event_name: str = "PreToolUse"


def _one_line(text: str, limit: int = _SUMMARY_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def names_the_whole_call(payload: HookPayload) -> bool:
    """The question's text alone identifies the tool call (a remembered answer to it may answer it again).

    A remembered decision matches on the question's text, not its ``detail``: so only a call whose
    whole input is its untruncated subject (plus a description) may be answered by one; the
    directory is named in the question then (``question_for(payload, remember=True)``).
    """
    key = _SUBJECT.get(payload.tool_name, "")
    subject = payload.tool_input.get(key)
    return (
        bool(payload.cwd)
        and isinstance(subject, str)
        and bool(subject.strip())
        and len(" ".join(subject.split())) <= _SUMMARY_CHARS
        and subject == " ".join(subject.split())
        and "`" not in subject
        and set(payload.tool_input) <= {key, "description"}
    )


def question_for(payload: HookPayload, *, remember: bool = False) -> AskUserQuestionRequest:
    """ "Allow Bash: `rm -rf build`?" with the whole tool input as the detail."""
    subject = payload.tool_input.get(_SUBJECT.get(payload.tool_name, ""), None)
    if not isinstance(subject, str) or not subject.strip():
        subject = json.dumps(payload.tool_input, ensure_ascii=False, sort_keys=True)
    summary = _one_line(subject).replace("`", "'")
    lines = []
    description = payload.tool_input.get("description")
    if isinstance(description, str) and description.strip():
        lines += [description.strip(), ""]
    body = json.dumps(payload.tool_input, ensure_ascii=False, indent=2, sort_keys=True)[:_DETAIL_CHARS]
    lines += [f"Claude Code wants to run **{payload.tool_name}** with:", "", "```json", body, "```"]
    if payload.cwd:
        lines += ["", f"in `{payload.cwd}`"]
    item = AskUserQuestionItem(
        id=QUESTION_ID,
        question=f"Allow {payload.tool_name}: `{summary}`" + (f" in `{payload.cwd}`?" if remember else "?"),
        header="Claude Code",
        detail="\n".join(lines),
        options=(
            AskUserQuestionOption(label=ALLOW, description="let this tool call run"),
            AskUserQuestionOption(label=DENY, description="block it; type a note instead to tell Claude why"),
        ),
    )
    return AskUserQuestionRequest(questions=(item,))


def decide(answer: AskUserQuestionAnswer) -> tuple[Decision, str]:
    """The decision and its reason from the human's answer."""
    item = answer.answers[0]
    if item.custom is not None:
        return "deny", f"The user says: {item.custom}"
    if item.selected == (ALLOW,):
        return "allow", "allowed by the user through question-broker"
    if item.selected == (DENY,):
        return "deny", "denied by the user through question-broker"
    return "ask", "the user skipped the question in question-broker"


def hook_output(decision: Decision, reason: str) -> dict[str, Any]:
    """The JSON Claude Code reads from a PreToolUse hook's stdout."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,
            "permissionDecisionReason": reason,
        }
    }


def _agent_id(payload: HookPayload, given: str | None) -> str:
    if given:
        return given
    unique = re.sub(r"[^A-Za-z0-9_.:-]", "-", payload.tool_use_id or "")[:80]
    return f"claude-code-{unique}" if unique else "claude-code"


async def _ask(
    settings: Settings, request: AskUserQuestionRequest, agent_id: str, timeout: float, *, remember: bool = True
) -> Any:
    abort = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # Claude Code gives up on us: withdraw the question
        loop.add_signal_handler(sig, abort.set)
    try:
        async with settings.broker() as broker, broker.agent(agent_id) as agent:
            return await agent.ask(request, abort=abort, timeout=timeout, remember=remember)
    except* UserQuestionError as group:  # `broker.agent()` wraps what its body raises in a group
        raise group.exceptions[0] from None
    except* (OSError, RedisError) as group:
        raise UserQuestionError(f"Redis is unavailable: {group.exceptions[0]}", BROKER_UNAVAILABLE) from None
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _say(message: str) -> None:
    print(f"qbroker claude-hook: {message}", file=sys.stderr, flush=True)


async def hook(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    fallback: Decision = args.on_unavailable
    raw = sys.stdin.buffer.read()
    try:
        payload = msgspec.json.decode(raw, type=HookPayload)
    except msgspec.DecodeError as error:
        _say(f"not a PreToolUse payload: {error}")
        return _print("ask", f"question-broker could not read the hook payload: {error}")
    try:
        remember = bool(getattr(args, "remember", False)) and names_the_whole_call(payload)
        answer = await _ask(
            settings,
            question_for(payload, remember=remember),
            _agent_id(payload, args.agent),
            args.timeout,
            remember=remember,
        )
    except UserQuestionError as error:
        if error.code == ASK_CANCELLED:
            return _print("deny", f"the user dismissed the question in question-broker: {error.message}")
        _say(str(error))
        return _print(fallback, f"question-broker: {error.code}: {error.message}")
    decision, reason = decide(answer)
    return _print(decision, reason)


def _print(decision: Decision, reason: str) -> int:
    sys.stdout.write(json.dumps(hook_output(decision, reason)) + "\n")
    sys.stdout.flush()
    return 0
