"""Tool-call approvals as batches of Approve / Deny questions; shared by the adapters.

A framework may stop for any number of calls with arguments of any size, while one request
holds at most 20 questions and 512 kB (``broker.validation.Limits``). So the calls are split
into requests of at most ``MAX_CALLS`` questions and ``MAX_REQUEST_BYTES``, asked at once
(several cards, one per batch), and an argument text over ``MAX_ARGS_BYTES`` is shown cut,
with its size and SHA-256, and attached whole (``Broker.attach``, up to 4 MB): the question
names it (``attachment``) and a page shows it all at a click, once its bytes match the digest.
Each batch is a keyed ask when the caller gives a key: a restarted process asking about the
same calls re-attaches to the same cards.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

import msgspec

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Attachment,
    Editable,
)
from broker.attachments import MAX_ATTACHMENT_BYTES
from broker.types import encode

__all__ = [
    "APPROVE",
    "DENY",
    "MAX_ARGS_BYTES",
    "MAX_CALLS",
    "Asker",
    "ToolCall",
    "Verdict",
    "approval_request",
    "approval_requests",
    "ask_approvals",
    "verdicts",
]

APPROVE: Final = "Approve"
DENY: Final = "Deny"
MAX_CALLS: Final = 20
"""questions per request: the broker's default ``Limits.max_questions``"""
MAX_ARGS_BYTES: Final = 64 * 1024
"""argument text shown whole on a card; beyond it the head, the size and the digest"""
MAX_NOTE_BYTES: Final = 8 * 1024
"""a description or metadata note (a framework's description may repeat the arguments)"""
MAX_REQUEST_BYTES: Final = 400 * 1024
"""a batch's wire size, under the broker's 512 kB with room for the agent id and escaping"""
_SUMMARY_CHARS: Final = 200
_DEFAULT_OPTIONS: Final = (
    AskUserQuestionOption(label=APPROVE, description="let this call run"),
    AskUserQuestionOption(label=DENY, description="block it (or type a note: the agent reads it)"),
)


class Asker(Protocol):
    """What the adapters ask through: a live ``broker.Agent`` (preferred) or a ``Broker``."""

    async def ask(
        self,
        request: AskUserQuestionRequest,
        *,
        abort: asyncio.Event | None = ...,
        timeout: float | None = ...,
        key: str | None = ...,
    ) -> AskUserQuestionAnswer: ...


@runtime_checkable
class Attacher(Protocol):
    """An asker that can also keep a cut text whole (``broker.Agent`` and ``Broker`` can)."""

    async def attach(self, text: str) -> str: ...


@dataclass(frozen=True)
class ToolCall:
    """One call awaiting approval: its id (the question id), the tool and its arguments.

    ``summary`` replaces the arguments in the one-line question (a shell command, say) and
    ``body`` the arguments block of the detail (a patch as a diff); ``notes`` are shown above
    it (the framework's description of the call, its metadata). ``options`` replace Approve /
    Deny when the framework allows other decisions (``()``: a free-text question).
    """

    call_id: str
    tool_name: str
    args: Mapping[str, Any] | str
    summary: str | None = None
    body: str | None = None
    body_language: str = "diff"
    notes: tuple[str, ...] = ()
    options: tuple[AskUserQuestionOption, ...] | None = None
    question: str | None = None
    """a question the tool asks the human (not an approval): shown as is, without the arguments"""
    editable: bool = False
    """offer the arguments (a mapping, shown whole) for editing with the approving option"""
    schema: Mapping[str, Any] | None = None
    """the tool's JSON Schema for its arguments, which an edit must satisfy"""
    approve: str = APPROVE
    """the label of the option that approves (an edit goes with it)"""


@dataclass(frozen=True)
class Verdict:
    """The human's decision on one call; ``message`` is for the model when denied.

    ``choice`` is the label picked (None for a note or a skip), ``note`` the text typed as
    "Other", ``skipped`` that neither was given.
    """

    approved: bool
    message: str
    choice: str | None = None
    note: str | None = None
    edited: dict[str, Any] | None = None
    """the arguments as the human edited them (approved calls only; None: run them as they were)"""
    by: str | None = None
    """who decided, as the answer's verified seal names them (``AskUserQuestionAnswer.answered_by``)"""

    @property
    def skipped(self) -> bool:
        return self.choice is None and self.note is None


def _args_text(args: Mapping[str, Any] | str) -> str:
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, indent=2, default=str)


def _one_line(text: str) -> str:
    flat = " ".join(text.split()).replace("`", "'")
    return flat if len(flat) <= _SUMMARY_CHARS else flat[: _SUMMARY_CHARS - 1] + "…"


def _cut(text: str, limit: int) -> tuple[str, str | None]:
    """``text`` whole, or its head within ``limit`` UTF-8 bytes and a line saying what was left out."""
    raw = text.encode()
    if len(raw) <= limit:
        return text, None
    head = raw[:limit].decode(errors="ignore")
    digest = hashlib.sha256(raw).hexdigest()
    where = (
        "attached whole (a page shows all of it)"
        if len(raw) <= MAX_ATTACHMENT_BYTES
        else "too large to attach; they are in the run's state"
    )
    return head, (
        f"*Shown: the first {len(head.encode()):,} of {len(raw):,} bytes (SHA-256 `{digest}`); "
        f"the whole arguments are {where}, and the call runs with them whole.*"
    )


def _attachment(text: str, limit: int) -> Attachment | None:
    """What names ``text`` when it is shown cut and small enough to attach."""
    raw = text.encode()
    if len(raw) <= limit or len(raw) > MAX_ATTACHMENT_BYTES:
        return None
    return Attachment(sha256=hashlib.sha256(raw).hexdigest(), size=len(raw))


def _fence(text: str, language: str) -> str:
    ticks = "```"
    while ticks in text:  # a fence the text cannot close
        ticks += "`"
    return f"{ticks}{language}\n{text}\n{ticks}"


def _body(call: ToolCall) -> tuple[str, str]:
    """The text shown in the card's block (the arguments, or the call's own body) and its language."""
    if call.body is not None:
        return call.body, call.body_language
    return _args_text(call.args), "json" if not isinstance(call.args, str) else ""


def _item(call: ToolCall, header: str, limit: int) -> AskUserQuestionItem:
    if call.question is not None:
        return AskUserQuestionItem(
            id=call.call_id,
            question=call.question[:4_000],
            header=header,
            detail="\n\n".join((f"Asked through the agent's **{call.tool_name}** tool.", *call.notes)),
            options=call.options or None,
        )
    body, language = _body(call)
    shown, cut = _cut(body, limit)
    if call.summary is not None:
        summary = call.summary
    elif isinstance(call.args, str):
        summary = call.args
    else:
        summary = json.dumps(call.args, ensure_ascii=False, sort_keys=True, default=str) if call.args else ""
    notes = [
        _cut(note, MAX_NOTE_BYTES)[0] + ("…" if len(note.encode()) > MAX_NOTE_BYTES else "") for note in call.notes
    ]
    parts = [f"The agent wants to call **{call.tool_name}**" + (" with:" if body else "."), *notes]
    if body:
        parts.append(_fence(shown, language))
    if cut:
        parts.append(cut)
    options = _DEFAULT_OPTIONS if call.options is None else call.options or None
    return AskUserQuestionItem(
        id=call.call_id,
        question=f"Allow {call.tool_name}: `{_one_line(summary)}`?" if summary else f"Allow {call.tool_name}?",
        header=header,
        detail="\n\n".join(parts),
        options=options,
        editable=_editable(call, options, cut is None),
        attachment=_attachment(body, limit),
    )


def _editable(call: ToolCall, options: tuple[AskUserQuestionOption, ...] | None, whole: bool) -> Editable | None:
    """The arguments offered for editing, when asked for and shown whole (an edit starts from all of them)."""
    if not call.editable or not whole or isinstance(call.args, str):
        return None
    if call.approve not in [option.label for option in options or ()]:
        return None
    arguments = json.loads(json.dumps(call.args, default=str))  # plain JSON, as the human will see it
    return Editable(arguments=arguments, approve=call.approve, schema=dict(call.schema) if call.schema else None)


def approval_request(calls: Iterable[ToolCall], *, header: str = "Tool approval") -> AskUserQuestionRequest:
    """One question per call, in order: "Allow delete_file: `{"path": "a"}`?" with Approve / Deny."""
    return AskUserQuestionRequest(questions=tuple(_item(call, header, MAX_ARGS_BYTES) for call in calls))


def approval_requests(calls: Iterable[ToolCall], *, header: str = "Tool approval") -> list[AskUserQuestionRequest]:
    """``approval_request`` split into requests the broker takes: at most ``MAX_CALLS`` and ~400 kB each."""
    batches: list[list[AskUserQuestionItem]] = [[]]
    size = 0
    for call in calls:
        item = _item(call, header, MAX_ARGS_BYTES)
        item_size = len(encode(item))
        if batches[-1] and (len(batches[-1]) == MAX_CALLS or size + item_size > MAX_REQUEST_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(item)
        size += item_size
    return [AskUserQuestionRequest(questions=tuple(batch)) for batch in batches if batch]


async def _attach(
    asker: Asker, calls: Sequence[ToolCall], requests: list[AskUserQuestionRequest]
) -> list[AskUserQuestionRequest]:
    """Keep each cut text whole before its card is asked; without a way to, the cards name no attachment."""
    named = {item.attachment.sha256 for request in requests for item in request.questions if item.attachment}
    if not named:
        return requests
    if isinstance(asker, Attacher):
        texts = {
            hashlib.sha256(text.encode()).hexdigest(): text
            for text in (_body(c)[0] for c in calls if c.question is None)
            if len(text) > MAX_ARGS_BYTES // 4  # a cut text has more UTF-8 bytes than that many characters
        }
        await asyncio.gather(*(asker.attach(texts[digest]) for digest in named))
        return requests
    return [
        msgspec.structs.replace(
            request, questions=tuple(msgspec.structs.replace(item, attachment=None) for item in request.questions)
        )
        for request in requests
    ]


def verdicts(answer: AskUserQuestionAnswer) -> dict[str, Verdict]:
    """Approve approves; Deny, a note ("Other": shown to the model) or a skip denies."""
    result = {}
    by = answer.answered_by
    for item in answer.answers:
        if item.custom is not None:
            result[item.id] = Verdict(False, f"The user denied this call: {item.custom}", note=item.custom, by=by)
        elif item.selected == (APPROVE,):
            message = "approved by the user" + (" with edited arguments" if item.edited is not None else "")
            result[item.id] = Verdict(True, message, choice=APPROVE, edited=item.edited, by=by)
        elif item.selected:
            # another approving label (Accept, say) keeps its edit for the adapter that offered it
            denied = "The user denied this call."
            result[item.id] = Verdict(False, denied, choice=item.selected[0], edited=item.edited, by=by)
        else:
            result[item.id] = Verdict(False, "The user skipped this approval; the call did not run.", by=by)
    return result


def batch_key(prefix: str, request: AskUserQuestionRequest) -> str:
    """A key naming one batch by the calls it holds (question ids), within the broker's 200 characters."""
    ids = "\x00".join(item.id for item in request.questions)
    return f"{prefix[:120]}:{hashlib.sha1(ids.encode()).hexdigest()}"


async def ask_approvals(
    asker: Asker,
    calls: Sequence[ToolCall],
    *,
    timeout: float | None = None,
    key: str | None = None,
    header: str = "Tool approval",
) -> dict[str, Verdict]:
    """Ask about ``calls`` (every batch at once); the verdicts by call id.

    ``key``: each batch is a keyed ask under ``key`` and its calls' ids, so the same calls
    asked again after a restart re-attach to their cards. The first failed batch's
    ``UserQuestionError`` is raised (the other batches are withdrawn).
    """
    requests = approval_requests(calls, header=header)
    if not requests:
        return {}
    requests = await _attach(asker, calls, requests)

    async def one(request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
        batch = batch_key(key, request) if key is not None else None
        return await asker.ask(request, timeout=timeout, key=batch)

    if len(requests) == 1:
        answers = [await one(requests[0])]
    else:
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(request)) for request in requests]
        except* Exception as failed:
            raise failed.exceptions[0] from None
        answers = [task.result() for task in tasks]
    decided: dict[str, Verdict] = {}
    for answer in answers:
        decided.update(verdicts(answer))
    return decided
