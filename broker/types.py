"""Wire types: the seeds' user-questions contract as msgspec Structs.

JSON field names are the seeds' camelCase; Python attributes are snake_case. Unknown
fields are ignored and intents of an unknown ``kind`` decode to ``UnknownIntent``, so a
newer peer can talk to an older one (and the other way round).
"""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import ErrorPayload

__all__ = [
    "AskUserQuestionAnswer",
    "AskUserQuestionAnswerItem",
    "AskUserQuestionIntent",
    "AskUserQuestionItem",
    "AskUserQuestionOption",
    "AskUserQuestionRequest",
    "PlanReviewIntent",
    "Outcome",
    "UnknownIntent",
    "convert_answer",
    "convert_request",
    "decode_answer",
    "decode_outcome",
    "decode_request",
    "encode",
]


class AskUserQuestionIntent:
    """Base of every presentation intent; ``kind`` is its tag."""

    __slots__ = ()

    @property
    def kind(self) -> str:
        raise NotImplementedError


class PlanReviewIntent(
    msgspec.Struct,
    AskUserQuestionIntent,
    frozen=True,
    kw_only=True,
    tag="plan-review",
    tag_field="kind",
):
    """A plan submitted for review: ``detail`` carries the plan markdown.

    ``approve`` names, by label, the option that approves; every other option declines.
    """

    approve: str

    @property
    def kind(self) -> str:  # the tag is not a field; UIs still read `intent.kind`
        return "plan-review"


class UnknownIntent(AskUserQuestionIntent):
    """An intent of a kind this version does not know: a UI shows the generic list.

    The fields are kept as received so a router passes them on unchanged.
    """

    __slots__ = ("_kind", "fields")

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        self._kind = kind
        self.fields = fields

    @property
    def kind(self) -> str:
        return self._kind

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnknownIntent) and other.fields == self.fields

    def __hash__(self) -> int:
        return hash(self._kind)

    def __repr__(self) -> str:
        return f"UnknownIntent(kind={self.kind!r}, fields={self.fields!r})"


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    pass


class AskUserQuestionOption(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One selectable answer; ``label`` is both what a human sees and the value returned."""

    label: str
    description: str | None = None


class AskUserQuestionItem(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One question of a request; ``id`` is caller-chosen and echoed in the answer."""

    id: str
    question: str
    detail: str | None = None
    header: str | None = None
    options: tuple[AskUserQuestionOption, ...] | None = None
    multi_select: bool = False
    intent: AskUserQuestionIntent | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(option.label for option in self.options or ())


class AskUserQuestionRequest(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """A batch of questions, optionally from a named agent (its id)."""

    questions: tuple[AskUserQuestionItem, ...]
    agent: str | None = None


class AskUserQuestionAnswerItem(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """The answer to one question: chosen labels and/or free "Other" text."""

    id: str
    selected: tuple[str, ...]
    """always on the wire, as in the seeds (empty when skipped or replaced by ``custom``)"""
    custom: str | None = None

    @property
    def skipped(self) -> bool:
        return not self.selected and self.custom is None


class AskUserQuestionAnswer(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """The human's answer: one item per question, in question order."""

    answers: tuple[AskUserQuestionAnswerItem, ...]


def _decode_hook(type_: type, obj: Any) -> Any:
    if type_ is AskUserQuestionIntent:
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            raise msgspec.ValidationError("an intent is an object with a string `kind`")
        if obj["kind"] == "plan-review":
            return msgspec.convert(obj, PlanReviewIntent)
        return UnknownIntent(obj["kind"], obj)
    raise NotImplementedError(type_)


def _encode_hook(obj: Any) -> Any:
    if isinstance(obj, UnknownIntent):
        return obj.fields
    raise NotImplementedError(type(obj))


_encoder = msgspec.json.Encoder(enc_hook=_encode_hook)
_request_decoder = msgspec.json.Decoder(AskUserQuestionRequest, dec_hook=_decode_hook)
_answer_decoder = msgspec.json.Decoder(AskUserQuestionAnswer, dec_hook=_decode_hook)


def encode(value: Any) -> bytes:
    """JSON bytes of any wire value (request, answer, error payload)."""
    return _encoder.encode(value)


def decode_request(data: bytes | str) -> AskUserQuestionRequest:
    """Decode a request; raises ``msgspec.DecodeError`` on malformed input."""
    return _request_decoder.decode(data)


def decode_answer(data: bytes | str) -> AskUserQuestionAnswer:
    """Decode an answer; raises ``msgspec.DecodeError`` on malformed input."""
    return _answer_decoder.decode(data)


def convert_request(obj: Any) -> AskUserQuestionRequest:
    """Build a request from already-parsed JSON (a dict)."""
    return msgspec.convert(obj, AskUserQuestionRequest, dec_hook=_decode_hook)


def convert_answer(obj: Any) -> AskUserQuestionAnswer:
    """Build an answer from already-parsed JSON (a dict)."""
    return msgspec.convert(obj, AskUserQuestionAnswer, dec_hook=_decode_hook)


class Outcome(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a settled request leaves in its per-request key: an answer or an error."""

    answer: AskUserQuestionAnswer | None = None
    error: ErrorPayload | None = None


_outcome_decoder = msgspec.json.Decoder(Outcome, dec_hook=_decode_hook)


def decode_outcome(data: bytes | str) -> Outcome:
    return _outcome_decoder.decode(data)
