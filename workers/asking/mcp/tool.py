"""The tool ``ask_user_question``: its schemas, its arguments read into a request, its results."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import msgspec

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, UserQuestionError
from broker.errors import BAD_REQUEST
from broker.types import convert_request, encode

__all__ = [
    "INPUT_SCHEMA",
    "OUTPUT_SCHEMA",
    "TOOL",
    "TOOL_NAME",
    "ParsedCall",
    "answer_payload",
    "answer_result",
    "error_result",
    "parse_arguments",
]

TOOL_NAME = "ask_user_question"

_DESCRIPTION = (
    "Ask the human a batch of structured questions and wait for the answer. Each question has "
    "`question` text, optional `detail` (supporting text, e.g. plan markdown), a short `header`, "
    "`options` ({label, description}; the chosen labels come back verbatim), `multiSelect`, and "
    "an optional `intent` (for a plan review: {kind: 'plan-review', approve: <label of the "
    "approving option>}, with the plan in `detail`). `id` is optional: answers echo it, and "
    "questions without one are answered with generated ids plus their `question` text. The "
    "result is {answers: [{id, selected: [labels], custom?}]}: `custom` is free text the human "
    "typed instead; an item with empty `selected` and no `custom` was skipped. On failure the "
    "result is an error {name, code, message}: route on `code` (ASK_CANCELLED: the human "
    "dismissed it; ASK_TIMED_OUT: nobody answered in time; NO_PROVIDER: no UI is running; "
    "BAD_REQUEST / BAD_INTENT / EMPTY_QUESTIONS: fix the call)."
)

_OPTION_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "label": {"type": "string", "description": "what the human sees and what comes back"},
                "description": {"type": "string"},
            },
            "required": ["label"],
        },
        {"type": "string", "description": "shorthand for {label}"},
    ]
}

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "questions": {
            "type": "array",
            "description": "the questions, asked together as one batch",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "caller-chosen, echoed in the answer (optional)"},
                    "question": {"type": "string"},
                    "detail": {"type": "string", "description": "supporting text shown with the question"},
                    "header": {"type": "string", "description": "a short group label"},
                    "options": {"type": "array", "items": _OPTION_SCHEMA},
                    "multiSelect": {"type": "boolean", "default": False},
                    "multi_select": {"type": "boolean", "description": "alias of multiSelect"},
                    "intent": {
                        "type": "object",
                        "description": "presentation intent, e.g. {kind: 'plan-review', approve: 'Approve'}",
                        "properties": {"kind": {"type": "string"}, "approve": {"type": "string"}},
                        "required": ["kind"],
                    },
                },
                "required": ["question"],
            },
        },
        "timeoutSeconds": {
            "type": "number",
            "exclusiveMinimum": 0,
            "description": "give up (ASK_TIMED_OUT) when nobody answered within this many seconds",
        },
        "key": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "name the question durably: if this session stops before the answer, asking the "
            "same questions with the same key later gets the answer (or waits on the same question)",
        },
        "remember": {
            "type": "boolean",
            "default": True,
            "description": "false: always ask a human, even when the team remembered an answer to this question",
        },
        "priority": {
            "enum": ["urgent", "normal", "low"],
            "default": "normal",
            "description": "how soon a human should see it: urgent questions are presented first",
        },
        "coalesce": {
            "type": "boolean",
            "default": True,
            "description": "false: present it on its own even when other agents ask the identical question",
        },
    },
    "required": ["questions"],
}


OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answers": {
            "type": "array",
            "description": "one item per question, in question order",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "the question's id (generated: q1, q2, ...)"},
                    "selected": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "the chosen option labels; empty with no custom: skipped",
                    },
                    "custom": {"type": "string", "description": "free text the human typed instead"},
                    "question": {"type": "string", "description": "the question's text, when it came without an id"},
                },
                "required": ["id", "selected"],
            },
        },
        "name": {"type": "string", "description": "a failure's error class: UserQuestionError"},
        "code": {
            "type": "string",
            "description": "a failure's stable code (ASK_CANCELLED, ASK_TIMED_OUT, NO_PROVIDER, ...): route on it",
        },
        "message": {"type": "string", "description": "a failure's explanation, for the model"},
    },
    # An answer, or (isError) the coded failure: the specification wants every structured result to fit
    # the schema, and the official TypeScript client validates errors too (one that does not fit is a
    # protocol error there, where the model should have read the code).
    "oneOf": [{"required": ["answers"]}, {"required": ["name", "code", "message"]}],
}


# -- the tool's input: the seeds' request, or what popular coding agents emit ------------


class _InOption(msgspec.Struct, kw_only=True):
    label: str
    description: str | None = None


class _InItem(msgspec.Struct, kw_only=True):
    question: str
    id: str | None = None
    detail: str | None = None
    header: str | None = None
    options: list[_InOption | str] | None = None
    multi_select_camel: bool | None = msgspec.field(default=None, name="multiSelect")
    multi_select: bool | None = None
    intent: dict[str, Any] | None = None


class _InRequest(msgspec.Struct, kw_only=True):
    questions: list[_InItem]
    timeout_seconds: float | None = msgspec.field(default=None, name="timeoutSeconds")
    key: str | None = None
    remember: bool = True
    priority: str | None = None
    coalesce: bool = True


@dataclass(frozen=True)
class ParsedCall:
    request: AskUserQuestionRequest
    timeout: float | None
    key: str | None
    generated: dict[str, str]
    """question text by generated id, for the questions that came without an id"""
    remember: bool = True
    """False: a remembered decision may not answer it"""
    coalesce: bool = True
    """False: never presented together with identical questions of other agents"""


def parse_arguments(arguments: dict[str, Any] | None) -> ParsedCall:
    """Normalise the tool arguments into a request; ``BAD_REQUEST`` when they do not fit."""
    try:
        raw = msgspec.convert(arguments or {}, _InRequest)
    except msgspec.ValidationError as error:
        raise UserQuestionError(f"the arguments do not fit the tool's schema: {error}", BAD_REQUEST) from error
    if raw.timeout_seconds is not None and not raw.timeout_seconds > 0:
        raise UserQuestionError("timeoutSeconds must be positive", BAD_REQUEST)
    taken = {item.id for item in raw.questions if item.id is not None}
    generated: dict[str, str] = {}
    questions: list[dict[str, Any]] = []
    for index, item in enumerate(raw.questions, start=1):
        qid = item.id
        if qid is None:
            qid = f"q{index}"
            while qid in taken:
                qid += "_"
            taken.add(qid)
            generated[qid] = item.question
        question: dict[str, Any] = {"id": qid, "question": item.question}
        if item.detail is not None:
            question["detail"] = item.detail
        if item.header is not None:
            question["header"] = item.header
        if item.options is not None:
            question["options"] = [
                {"label": o} if isinstance(o, str) else msgspec.structs.asdict(o) for o in item.options
            ]
        multi = item.multi_select_camel if item.multi_select_camel is not None else item.multi_select
        if multi:
            question["multiSelect"] = True
        if item.intent is not None:
            question["intent"] = item.intent
        questions.append(question)
    try:
        request = convert_request({"questions": questions, **({"priority": raw.priority} if raw.priority else {})})
    except msgspec.ValidationError as error:
        raise UserQuestionError(f"the questions do not fit the request schema: {error}", BAD_REQUEST) from error
    return ParsedCall(
        request=request,
        timeout=raw.timeout_seconds,
        key=raw.key,
        generated=generated,
        remember=raw.remember,
        coalesce=raw.coalesce,
    )


def answer_payload(answer: AskUserQuestionAnswer, generated: dict[str, str]) -> dict[str, Any]:
    """The answer as JSON; items of questions that came without an id also carry their text."""
    payload: dict[str, Any] = msgspec.json.decode(encode(answer))
    for item in payload["answers"]:
        if item["id"] in generated:
            item["question"] = generated[item["id"]]
    return payload


def _result(payload: dict[str, Any], *, is_error: bool = False) -> types.CallToolResult:
    text = json.dumps(payload, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=payload, is_error=is_error
    )


def answer_result(answer: AskUserQuestionAnswer, generated: dict[str, str]) -> types.CallToolResult:
    return _result(answer_payload(answer, generated))


def error_result(error: UserQuestionError) -> types.CallToolResult:
    return _result(error.to_dict(), is_error=True)


TOOL = types.Tool(
    name=TOOL_NAME,
    title="Ask the user",
    description=_DESCRIPTION,
    input_schema=INPUT_SCHEMA,
    output_schema=OUTPUT_SCHEMA,
    annotations=types.ToolAnnotations(
        title="Ask the user", read_only_hint=True, destructive_hint=False, open_world_hint=False
    ),
)
