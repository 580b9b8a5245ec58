"""The rules a request and an answer must meet, each refusal with its code.

Pure functions over wire types: no I/O, so the asking side, the provider side and a
UI worker can all call them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from .attachments import MAX_ATTACHMENT_BYTES, is_digest
from .errors import BAD_ANSWER, BAD_INTENT, BAD_REQUEST, UserQuestionError
from .types import (
    PRIORITIES,
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionRequest,
    Editable,
    PlanReviewIntent,
    encode,
)

__all__ = ["Limits", "check_answer", "check_request"]


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Size limits on a request, enforced before anything is written."""

    max_questions: int = 20
    max_options: int = 50
    max_id_chars: int = 200
    max_label_chars: int = 500
    max_text_chars: int = 5_000
    """question, header and option descriptions"""
    max_detail_chars: int = 200_000
    max_custom_chars: int = 20_000
    max_request_bytes: int = 512 * 1024
    max_edited_bytes: int = 256 * 1024
    """a tool call's arguments as the human edited them (an answer item's ``edited``)"""


def check_request(request: AskUserQuestionRequest, limits: Limits) -> None:
    """Check the intent rules (``BAD_INTENT``), then structure and size (``BAD_REQUEST``).

    Emptiness and the caller gate are checked by ``ask()`` before this, in the seeds'
    order.
    """
    for item in request.questions:
        intent = item.intent
        if intent is None:
            continue
        if isinstance(intent, PlanReviewIntent) and intent.approve not in item.labels:
            raise _bad_intent(f"question {item.id!r}: approve {intent.approve!r} names none of its options")
        if intent is not None and (item.detail is None or not item.detail.strip()):
            raise _bad_intent(f"question {item.id!r}: an intent needs `detail`")

    if len(request.questions) > limits.max_questions:
        raise _bad_request(f"{len(request.questions)} questions; at most {limits.max_questions}")
    seen_ids: set[str] = set()
    for item in request.questions:
        if not item.id.strip():
            raise _bad_request("a question id is empty")
        if item.id in seen_ids:
            raise _bad_request(f"question id {item.id!r} appears twice")
        seen_ids.add(item.id)
        _within(item.id, "id", item.id, limits.max_id_chars)
        _within(item.id, "text", item.question, limits.max_text_chars)
        _within(item.id, "header", item.header, limits.max_text_chars)
        _within(item.id, "detail", item.detail, limits.max_detail_chars)
        options = item.options or ()
        if len(options) > limits.max_options:
            raise _bad_request(f"question {item.id!r} has {len(options)} options; at most {limits.max_options}")
        labels: set[str] = set()
        for option in options:
            if not option.label.strip():
                raise _bad_request(f"question {item.id!r} has an empty option label")
            if option.label in labels:
                raise _bad_request(f"question {item.id!r}: option label {option.label!r} appears twice")
            labels.add(option.label)
            _within(item.id, "option label", option.label, limits.max_label_chars)
            _within(item.id, "option description", option.description, limits.max_text_chars)
        if item.editable is not None:
            _check_editable(item.id, item.editable, labels)
        if item.attachment is not None and not (
            is_digest(item.attachment.sha256) and 0 <= item.attachment.size <= MAX_ATTACHMENT_BYTES
        ):
            raise _bad_request(f"question {item.id!r}: attachment is a SHA-256 (64 lowercase hex) and a size")
    if request.priority not in PRIORITIES:
        raise _bad_request(f"priority {request.priority!r} is none of {', '.join(PRIORITIES)}")
    if request.agent is not None and not request.agent.strip():
        raise _bad_request("`agent` is empty")
    size = len(encode(request))
    if size > limits.max_request_bytes:
        raise _bad_request(f"request is {size} bytes; at most {limits.max_request_bytes}")


def check_answer(
    request: AskUserQuestionRequest, answer: AskUserQuestionAnswer, limits: Limits | None = None
) -> AskUserQuestionAnswer:
    """Return ``answer`` with its items in question order, or raise ``BAD_ANSWER``."""
    limits = limits or Limits()
    by_id: dict[str, AskUserQuestionAnswerItem] = {}
    for offered in answer.answers:
        if offered.id in by_id:
            raise _bad_answer(f"question {offered.id!r} is answered twice")
        by_id[offered.id] = offered
    known = {item.id for item in request.questions}
    if any(offered not in known for offered in by_id):
        unknown = sorted(set(by_id) - known)
        raise _bad_answer(f"unknown question ids: {', '.join(map(repr, unknown))}")
    ordered: list[AskUserQuestionAnswerItem] = []
    for item in request.questions:
        given = by_id.get(item.id)
        if given is None:
            raise _bad_answer(f"question {item.id!r} has no answer item")
        _check_selection(item.id, item.labels, item.multi_select, given.selected)
        if given.custom is not None:
            if not given.custom.strip():
                raise _bad_answer(f"question {item.id!r}: `custom` is blank")
            if len(given.custom) > limits.max_custom_chars:
                raise _bad_answer(f"question {item.id!r}: `custom` is over {limits.max_custom_chars} characters")
            if not item.multi_select and given.selected:
                raise _bad_answer(f"question {item.id!r}: single-select `custom` replaces the choice")
        if given.edited is not None:
            _check_edit(item.id, item.editable, given.selected, given.custom, given.edited, limits)
        ordered.append(given)
    return AskUserQuestionAnswer(answers=tuple(ordered))


def _check_selection(item_id: str, labels: Iterable[str], multi: bool, selected: tuple[str, ...]) -> None:
    offered = set(labels)
    if len(set(selected)) != len(selected):
        raise _bad_answer(f"question {item_id!r}: a label is selected twice")
    stray = [label for label in selected if label not in offered]
    if stray:
        raise _bad_answer(f"question {item_id!r}: {', '.join(map(repr, stray))} is not one of its options")
    if not multi and len(selected) > 1:
        raise _bad_answer(f"question {item_id!r} is single-select; {len(selected)} labels selected")


def _check_editable(item_id: str, editable: Editable, labels: set[str]) -> None:
    if editable.approve not in labels:
        raise _bad_request(f"question {item_id!r}: editable.approve {editable.approve!r} names none of its options")
    if editable.schema is not None:
        from jsonschema import exceptions, validators  # only an editable request with a schema pays the import

        try:
            validators.validator_for(editable.schema).check_schema(editable.schema)
        except exceptions.SchemaError as error:
            raise _bad_request(f"question {item_id!r}: editable.schema is not a JSON Schema: {error.message}") from None


def _check_edit(
    item_id: str,
    editable: Editable | None,
    selected: tuple[str, ...],
    custom: str | None,
    edit: dict[str, Any],
    limits: Limits,
) -> None:
    if editable is None:
        raise _bad_answer(f"question {item_id!r} offers no edit (it has no `editable`)")
    # An edit without the approving choice would be read as approved by nobody and run by no one:
    # refuse it rather than let an adapter guess.
    if editable.approve not in selected or custom is not None:
        raise _bad_answer(f"question {item_id!r}: edited arguments go only with {editable.approve!r} selected")
    size = len(encode(edit))
    if size > limits.max_edited_bytes:
        limit = limits.max_edited_bytes
        raise _bad_answer(f"question {item_id!r}: the edited arguments are {size} bytes; at most {limit}")
    if editable.schema is None:
        return
    from jsonschema import exceptions, validators

    try:
        validator = validators.validator_for(editable.schema)(editable.schema)
        error = exceptions.best_match(validator.iter_errors(edit))
    except Exception as failure:  # an unresolvable $ref, a schema too deep: the edit cannot be shown to fit
        raise _bad_answer(f"question {item_id!r}: the tool's schema could not be applied: {failure}") from None
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the top level"
        raise _bad_answer(
            f"question {item_id!r}: the edited arguments do not fit the tool's schema at {where}: {error.message}"
        )


def _within(item_id: str, what: str, text: str | None, limit: int) -> None:
    """Refuse ``text`` over ``limit`` characters (the message is only built for a refusal)."""
    if text is not None and len(text) > limit:
        raise _bad_request(f"question {item_id!r} {what} is {len(text)} characters; at most {limit}")


def _bad_intent(message: str) -> UserQuestionError:
    return UserQuestionError(message, BAD_INTENT)


def _bad_request(message: str) -> UserQuestionError:
    return UserQuestionError(message, BAD_REQUEST)


def _bad_answer(message: str) -> UserQuestionError:
    return UserQuestionError(message, BAD_ANSWER)
