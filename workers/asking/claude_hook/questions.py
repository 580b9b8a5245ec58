"""What ``qbroker claude-hook`` asks about a Claude Code tool call, and what the answer decides.

Three kinds of call, three questions (shapes from Claude Code's hooks reference):

- ``AskUserQuestion``: Claude's own questions (``{questions: [{question, header, options, multiSelect}]}``)
  asked as they are; the answer goes back in the tool's input, ``answers: {question text: label}``
  (a multi-select's labels joined with ", "; typed "Other" text as it is).
- ``ExitPlanMode``: a plan review (intent plan-review, the plan as the detail); approving lets the tool
  run, a note or "Keep planning" denies it with the note for Claude.
- any other tool: "Allow Bash: `rm -rf build`?" (Allow / Allow and remember / Deny / Deny and stop: a deny
  that also interrupts Claude, ``interrupt: true``). "Allow and
  remember" is offered where Claude Code itself suggests an allow rule (``permission_suggestions``)
  or for an MCP tool (a rule for that tool), and is written back as ``updatedPermissions``. The
  tool input is offered for editing with Allow: allowed with an edit, the call runs with the edit
  (``updatedInput``). Claude Code publishes no schema for its tools' inputs, so the edit is checked
  as a JSON object only; Claude Code validates it against the tool when it runs.

Every card names the session, the subagent type, the permission mode and the directory in its detail.

What the human sees is what runs: a tool input (or plan) longer than the card shows is shown cut, with
its size and SHA-256, and attached whole (``Broker.attach``): the question names the attachment, so a
face shows every byte Allow lets run one click away, and the request's digest binds them. An input too
large to attach (4 MB) is not asked about at all (``shows_whole``): Claude Code's own dialog asks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Attachment,
    Editable,
    PlanReviewIntent,
)
from broker.attachments import MAX_ATTACHMENT_BYTES

__all__ = [
    "ALLOW",
    "ALLOW_REMEMBER",
    "APPROVE",
    "DENY",
    "DENY_STOP",
    "HookPayload",
    "Verdict",
    "Asking",
    "asking_for",
    "names_the_whole_call",
    "shows_whole",
]

ALLOW: Final = "Allow"
ALLOW_REMEMBER: Final = "Allow and remember"
DENY: Final = "Deny"
DENY_STOP: Final = "Deny and stop"
APPROVE: Final = "Approve"
KEEP_PLANNING: Final = "Keep planning"
QUESTION_ID: Final = "permission"
PLAN_ID: Final = "plan"
_SUMMARY_CHARS: Final = 200
_DETAIL_CHARS: Final = 20_000
"""a tool input or plan shown on the card itself; beyond it the head, and the whole attached"""
_EDITABLE_BYTES: Final = 64 * 1024
"""a tool input offered for editing whole (a larger one, a big Write say, is shown cut and not offered)"""

Behavior = Literal["allow", "deny", "ask"]
Destination = Literal["session", "localSettings"]

# The input field that says what a built-in tool is about to touch.
_SUBJECT: Final[Mapping[str, str]] = {
    "Bash": "command",
    "PowerShell": "command",
    "Edit": "file_path",
    "Write": "file_path",
    "Read": "file_path",
    "NotebookEdit": "notebook_path",
    "WebFetch": "url",
    "WebSearch": "query",
    "Glob": "pattern",
    "Grep": "pattern",
    "Skill": "skill",
    "Agent": "description",
}


class HookPayload(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a hook payload this hook reads (others are ignored)."""

    hook_event_name: str = ""
    tool_name: str = ""
    tool_input: dict[str, Any] = {}
    tool_use_id: str | None = None
    """PreToolUse only: a PermissionRequest payload carries none"""
    session_id: str | None = None
    transcript_path: str | None = None
    cwd: str | None = None
    permission_mode: str | None = None
    agent_id: str | None = None
    """set when the call comes from a subagent"""
    agent_type: str | None = None
    permission_suggestions: list[Any] = []


@dataclass(frozen=True)
class Verdict:
    """What the answer decides, whatever the hook event it is written for."""

    behavior: Behavior
    reason: str
    updated_input: dict[str, Any] | None = None
    updated_permissions: list[dict[str, Any]] | None = None
    interrupt: bool = False
    """a deny that also stops Claude (PermissionRequest's ``interrupt: true``): the person chose to"""


@dataclass(frozen=True)
class Asking:
    """One tool call's question and how to read its answer."""

    request: AskUserQuestionRequest
    remember: bool
    """a remembered broker decision may answer it"""
    payload: HookPayload
    kind: Literal["questions", "plan", "permission"]
    remembered_rules: list[dict[str, Any]] | None = None
    destination: Destination = "session"
    attachments: tuple[str, ...] = ()
    """the texts the questions name as attachments: kept (``attach``) before the question is asked"""

    @property
    def coalesce(self) -> bool:
        """Whether the card may be shared with identical asks: not an approval, where one click would run them all."""
        return self.kind == "questions"

    def verdict(self, answer: AskUserQuestionAnswer) -> Verdict:
        if self.kind == "questions":
            return self._questions_verdict(answer)
        item = answer.answers[0]
        if self.kind == "plan":
            if item.selected == (APPROVE,):
                return Verdict("allow", "the user approved the plan through question-broker", self.payload.tool_input)
            if item.custom is not None:
                return Verdict("deny", f"The user wants changes to the plan: {item.custom}")
            if item.selected:
                return Verdict("deny", "The user did not approve the plan: keep planning")
            return Verdict("ask", "the user skipped the plan review in question-broker")
        if item.custom is not None:
            return Verdict("deny", f"The user says: {item.custom}")
        if item.selected == (ALLOW,) and item.edited is not None:
            return Verdict("allow", "allowed by the user with an edited input through question-broker", item.edited)
        if item.selected == (ALLOW,):
            return Verdict("allow", "allowed by the user through question-broker")
        if item.selected == (ALLOW_REMEMBER,) and self.remembered_rules:
            rule = {"type": "addRules", "rules": self.remembered_rules, "behavior": "allow"}
            return Verdict(
                "allow",
                "allowed and remembered by the user through question-broker",
                updated_permissions=[{**rule, "destination": self.destination}],
            )
        if item.selected == (DENY,):
            return Verdict("deny", "denied by the user through question-broker")
        if item.selected == (DENY_STOP,):
            return Verdict("deny", "denied by the user through question-broker, who stopped Claude", interrupt=True)
        return Verdict("ask", "the user skipped the question in question-broker")

    def _questions_verdict(self, answer: AskUserQuestionAnswer) -> Verdict:
        texts = {item.id: item.question for item in self.request.questions}
        answers: dict[str, str] = {}
        for item in answer.answers:
            chosen = [*item.selected, *([item.custom] if item.custom is not None else [])]
            if chosen:
                answers[texts[item.id]] = ", ".join(chosen)
        if not answers:
            return Verdict("ask", "the user skipped the questions in question-broker")
        return Verdict(
            "allow", "answered by the user through question-broker", {**self.payload.tool_input, "answers": answers}
        )


# -- the questions ------------------------------------------------------------------------------


def asking_for(payload: HookPayload, *, remember: bool = False, destination: Destination = "session") -> Asking | None:
    """The question for this call; None when the call's input does not fit its tool's shape."""
    if payload.tool_name == "AskUserQuestion":
        request = _claudes_questions(payload)
        return None if request is None else Asking(request, True, payload, "questions")
    if not shows_whole(payload):
        return None
    if payload.tool_name == "ExitPlanMode":
        request, attached = _plan_review(payload)
        return Asking(request, False, payload, "plan", attachments=attached)
    rules = _remembered_rules(payload) if payload.hook_event_name == "PermissionRequest" else None
    whole = remember and names_the_whole_call(payload)
    request, attached = _permission(payload, whole, rules, destination)
    return Asking(request, whole, payload, "permission", rules, destination, attached)


def shows_whole(payload: HookPayload) -> bool:
    """Whether a card can show every byte of the call's input: on the card, or attached (at most 4 MB)."""
    return len(_input_json(payload).encode()) <= MAX_ATTACHMENT_BYTES


def _input_json(payload: HookPayload) -> str:
    return json.dumps(payload.tool_input, ensure_ascii=False, indent=2, sort_keys=True)


def _fence(text: str, language: str = "") -> str:
    ticks = "```"
    while ticks in text:  # a fence the text cannot close
        ticks += "`"
    return f"{ticks}{language}\n{text}\n{ticks}"


def _shown(text: str) -> tuple[str, str | None, tuple[str, ...], Attachment | None]:
    """``text`` as a card shows it: whole, or its head, a line saying what was left out, and ``text`` attached."""
    if len(text) <= _DETAIL_CHARS:
        return text, None, (), None
    raw = text.encode()
    attachment = Attachment(sha256=hashlib.sha256(raw).hexdigest(), size=len(raw))
    head = text[:_DETAIL_CHARS]
    note = (
        f"*Shown: the first {len(head.encode()):,} of {len(raw):,} bytes (SHA-256 `{attachment.sha256}`); "
        "the whole is attached (show all of it before you approve), and the call runs with it whole.*"
    )
    return head, note, (text,), attachment


def _context(payload: HookPayload) -> str:
    """Where and for whom: the line every card ends with."""
    parts = []
    if payload.session_id:
        parts.append(f"session `{payload.session_id}`")
    if payload.agent_type:
        parts.append(f"subagent `{payload.agent_type}`")
    if payload.permission_mode:
        parts.append(f"permission mode `{payload.permission_mode}`")
    where = f" in `{payload.cwd}`" if payload.cwd else ""
    return f"Claude Code{where}" + (f" ({', '.join(parts)})" if parts else "")


class _InOption(msgspec.Struct, frozen=True):
    label: str
    description: str | None = None


class _InQuestion(msgspec.Struct, frozen=True, rename="camel"):
    question: str
    header: str | None = None
    options: list[_InOption] | None = None
    multi_select: bool = False


class _InQuestions(msgspec.Struct, frozen=True):
    questions: list[_InQuestion]


def _claudes_questions(payload: HookPayload) -> AskUserQuestionRequest | None:
    try:
        given = msgspec.convert(payload.tool_input, _InQuestions)
    except msgspec.ValidationError:
        return None
    context = f"Asked by {_context(payload)}."
    items = tuple(
        AskUserQuestionItem(
            id=f"q{index}",
            question=q.question,
            header=q.header,
            detail=context,
            options=None
            if q.options is None
            else tuple(AskUserQuestionOption(label=o.label, description=o.description) for o in q.options),
            multi_select=q.multi_select,
        )
        for index, q in enumerate(given.questions, start=1)
    )
    return AskUserQuestionRequest(questions=items)


def _plan_review(payload: HookPayload) -> tuple[AskUserQuestionRequest, tuple[str, ...]]:
    plan = payload.tool_input.get("plan")
    if not isinstance(plan, str) or not plan.strip():
        text = _fence(_input_json(payload), "json")
    else:
        # Approving lets the tool run with its whole input: any field beside the plan is shown too.
        others = {name: value for name, value in payload.tool_input.items() if name != "plan"}
        text = (
            plan
            if not others
            else plan
            + "\n\n---\n\nWith:\n\n"
            + _fence(json.dumps(others, ensure_ascii=False, indent=2, sort_keys=True), "json")
        )
    shown, note, attached, attachment = _shown(text)
    item = AskUserQuestionItem(
        id=PLAN_ID,
        question="Approve Claude Code's plan?",
        header="Plan",
        detail="\n\n".join((shown, *([note] if note else []), "---", _context(payload))),
        attachment=attachment,
        options=(
            AskUserQuestionOption(label=APPROVE, description="leave plan mode and carry the plan out"),
            AskUserQuestionOption(label=KEEP_PLANNING, description="type a note instead to say what to change"),
        ),
        intent=PlanReviewIntent(approve=APPROVE),
    )
    return AskUserQuestionRequest(questions=(item,)), attached


def _one_line(text: str, limit: int = _SUMMARY_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def names_the_whole_call(payload: HookPayload) -> bool:
    """The question's text alone identifies the tool call (a remembered answer to it may answer it again).

    A remembered decision matches on the question's text, not its ``detail``: so only a call whose
    whole input is its untruncated subject (plus a description) may be answered by one; the
    directory is named in the question then.
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


def _remembered_rules(payload: HookPayload) -> list[dict[str, Any]] | None:
    """The allow rules "Allow and remember" adds: Claude Code's own suggestion, or the whole MCP tool."""
    rules: list[dict[str, Any]] = []
    for suggestion in payload.permission_suggestions:
        if (
            isinstance(suggestion, dict)
            and suggestion.get("type") == "addRules"
            and suggestion.get("behavior") == "allow"
            and isinstance(suggestion.get("rules"), list)
        ):
            rules += [r for r in suggestion["rules"] if isinstance(r, dict) and isinstance(r.get("toolName"), str)]
    if not rules and payload.tool_name.startswith("mcp__"):
        rules = [{"toolName": payload.tool_name}]  # an MCP tool's rule names the tool, never more
    return rules or None


def _rule_text(rule: Mapping[str, Any]) -> str:
    content = rule.get("ruleContent")
    return f"{rule['toolName']}({content})" if isinstance(content, str) else str(rule["toolName"])


_WHERE: Final[Mapping[Destination, str]] = {
    "session": "for the rest of this Claude Code session",
    "localSettings": "in this project from now on (.claude/settings.local.json)",
}


def _permission(
    payload: HookPayload, whole: bool, rules: list[dict[str, Any]] | None, destination: Destination
) -> tuple[AskUserQuestionRequest, tuple[str, ...]]:
    """ "Allow Bash: `rm -rf build`?" with the whole tool input as the detail (or its head, and attached)."""
    subject = payload.tool_input.get(_SUBJECT.get(payload.tool_name, ""), None)
    if not isinstance(subject, str) or not subject.strip():
        subject = json.dumps(payload.tool_input, ensure_ascii=False, sort_keys=True)
    summary = _one_line(subject).replace("`", "'")
    lines = []
    description = payload.tool_input.get("description")
    if isinstance(description, str) and description.strip():
        lines += [description.strip(), ""]
    whole_body = _input_json(payload)
    body, note, attached, attachment = _shown(whole_body)
    lines += [f"Claude Code wants to run **{payload.tool_name}** with:", "", _fence(body, "json"), ""]
    if note:
        lines += [note, ""]
    lines.append(_context(payload))
    options = [AskUserQuestionOption(label=ALLOW, description="let this tool call run")]
    if rules:
        remembered = ", ".join(_rule_text(rule) for rule in rules)
        options.append(
            AskUserQuestionOption(
                label=ALLOW_REMEMBER, description=f"allow, and let Claude Code allow {remembered} {_WHERE[destination]}"
            )
        )
    options.append(AskUserQuestionOption(label=DENY, description="block it; type a note instead to tell Claude why"))
    options.append(AskUserQuestionOption(label=DENY_STOP, description="block it and stop Claude: it waits for you"))
    item = AskUserQuestionItem(
        id=QUESTION_ID,
        question=f"Allow {payload.tool_name}: `{summary}`" + (f" in `{payload.cwd}`?" if whole else "?"),
        header="Claude Code",
        detail="\n".join(lines),
        options=tuple(options),
        editable=(
            Editable(arguments=payload.tool_input, approve=ALLOW)
            if attachment is None and len(whole_body.encode()) <= _EDITABLE_BYTES
            else None
        ),
        attachment=attachment,
    )
    return AskUserQuestionRequest(questions=(item,)), attached
