"""Wire types: the seeds' user-questions contract as msgspec Structs.

JSON field names are the seeds' camelCase; Python attributes are snake_case. Unknown
fields are ignored and intents of an unknown ``kind`` decode to ``UnknownIntent``, so a
newer peer can talk to an older one (and the other way round). That holds however a
value is decoded: through ``decode_request`` or with msgspec directly
(``msgspec.json.decode(raw, type=AskUserQuestionItem)``, ``msgspec.convert``), and
``msgspec.json.encode`` writes every type back unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from .errors import ErrorPayload
from .signing import Proof

__all__ = [
    "AskUserQuestionAnswer",
    "AskUserQuestionAnswerItem",
    "AskUserQuestionIntent",
    "AskUserQuestionItem",
    "AskUserQuestionOption",
    "AskUserQuestionRequest",
    "Attachment",
    "Editable",
    "PRIORITIES",
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


class UnknownIntent(dict[str, Any], AskUserQuestionIntent):
    """An intent of a kind this version does not know: a UI shows the generic list.

    The fields are kept as received so a router passes them on unchanged: it is the
    received object itself (a ``dict``), so any JSON encoder writes it back as it came.
    """

    __slots__ = ()

    def __init__(self, kind: str, fields: dict[str, Any]) -> None:
        super().__init__(fields)
        self["kind"] = kind

    @property
    def kind(self) -> str:
        return str(self["kind"])

    @property
    def fields(self) -> dict[str, Any]:
        """Every field as received, ``kind`` included."""
        return dict(self)

    def __hash__(self) -> int:  # type: ignore[override]  # items are frozen Structs: hashable
        return hash(self.kind)

    def __repr__(self) -> str:
        return f"UnknownIntent(kind={self.kind!r}, fields={dict(self)!r})"


def _intent(obj: Any) -> AskUserQuestionIntent:
    """The intent a decoded JSON object stands for (``ValueError`` when it is none)."""
    if isinstance(obj, AskUserQuestionIntent):
        return obj
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        raise ValueError("an intent is an object with a string `kind`")
    if obj["kind"] == "plan-review":
        try:
            return msgspec.convert(obj, PlanReviewIntent)
        except msgspec.ValidationError as error:
            raise ValueError(f"a plan-review intent: {error}") from None
    return UnknownIntent(obj["kind"], obj)


# What msgspec sees of the `intent` field: a JSON object, which the item's __post_init__
# turns into a PlanReviewIntent or an UnknownIntent. A custom type would need a dec_hook,
# so `msgspec.json.decode(raw, type=AskUserQuestionItem)` without one failed on any intent.
_INTENT_JSON_SCHEMA: dict[str, Any] = {
    "title": "AskUserQuestionIntent",
    "description": "A presentation intent, tagged by `kind`. A UI that does not know a kind renders the generic "
    "option list; an intent never changes how the answer is encoded.",
    "oneOf": [
        {
            "title": "PlanReviewIntent",
            "description": "A plan submitted for review (the plan markdown is the question's `detail`); `approve` "
            "names, by label, the option that approves, every other option declines.",
            "type": "object",
            "properties": {"kind": {"enum": ["plan-review"]}, "approve": {"type": "string"}},
            "required": ["kind", "approve"],
        },
        {
            "title": "OtherIntent",
            "description": "An intent of another kind: its other fields are kept and passed on unchanged.",
            "type": "object",
            "properties": {"kind": {"type": "string", "not": {"const": "plan-review"}}},
            "required": ["kind"],
        },
    ],
}
if TYPE_CHECKING:
    _IntentField = AskUserQuestionIntent
else:
    _IntentField = Annotated[dict[str, Any], msgspec.Meta(extra_json_schema=_INTENT_JSON_SCHEMA)]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    pass


class AskUserQuestionOption(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One selectable answer; ``label`` is both what a human sees and the value returned."""

    label: str
    description: str | None = None


class Editable(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """A tool call's arguments the human may edit before approving (an approval question's ``editable``).

    ``approve`` names, by label, the option the edit goes with: edited arguments come back only
    with that option selected. ``schema`` is the tool's JSON Schema for its arguments, where known:
    the provider checks an edit against it. The arguments themselves are not checked against it
    (a model's call may not fit its tool's schema; the human may be the one to fix it).
    """

    arguments: dict[str, Any]
    approve: str
    schema: dict[str, Any] | None = None


class Attachment(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """A text a question shows cut (a tool call's whole arguments), kept by the broker under its SHA-256.

    ``sha256`` names it (64 lowercase hex digits) and ``size`` is its UTF-8 length. A provider
    fetches it (``Broker.attachment``) only when the human asks to see it all, and shows it only
    when its bytes hash to ``sha256``: a question names the exact text, never just a key.
    """

    sha256: str
    size: int


class AskUserQuestionItem(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """One question of a request; ``id`` is caller-chosen and echoed in the answer.

    ``editable``: the call's arguments, offered for editing with the approving option (a
    peer that does not know the field shows a plain approval and never sends an edit).
    ``attachment``: the whole of a text ``detail`` shows cut, one click away on a page.
    """

    id: str
    question: str
    detail: str | None = None
    header: str | None = None
    options: tuple[AskUserQuestionOption, ...] | None = None
    multi_select: bool = False
    intent: _IntentField | None = None
    editable: Editable | None = None
    attachment: Attachment | None = None

    def __post_init__(self) -> None:
        if self.intent is not None and not isinstance(self.intent, AskUserQuestionIntent):
            msgspec.structs.force_setattr(self, "intent", _intent(self.intent))

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple([option.label for option in self.options or ()])  # a list first: a third faster than a generator


PRIORITIES = ("urgent", "normal", "low")
"""a request's priority levels, most urgent first: providers present urgent questions first"""

if TYPE_CHECKING:
    _PriorityField = str
else:
    # A plain string on the wire, so an unknown level is refused by check_request with BAD_REQUEST
    # (a coded error) rather than failing to decode.
    _PriorityField = Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(PRIORITIES)})]


class AskUserQuestionRequest(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """A batch of questions, optionally from a named agent (its id).

    ``priority`` ("urgent", "normal" or "low") orders the provider's queue: urgent first, and
    within a level round-robin across asking agents. A peer that does not know it ignores it.
    """

    questions: tuple[AskUserQuestionItem, ...]
    agent: str | None = None
    priority: _PriorityField = "normal"


class AskUserQuestionAnswerItem(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """The answer to one question: chosen labels and/or free "Other" text.

    ``edited``: the arguments as the human edited them, for a question with ``editable``, sent
    with its approving option (signed with the rest of the outcome, so no asker can forge one).
    """

    id: str
    selected: tuple[str, ...]
    """always on the wire, as in the seeds (empty when skipped or replaced by ``custom``)"""
    custom: str | None = None
    edited: dict[str, Any] | None = None

    @property
    def skipped(self) -> bool:
        return not self.selected and self.custom is None


class AskUserQuestionAnswer(_Wire, frozen=True, kw_only=True, rename="camel", omit_defaults=True, dict=True):
    """The human's answer: one item per question, in question order.

    ``answered_by``: who answered, as the answering side sealed it (not a field: never on the wire,
    never compared).
    """

    answers: tuple[AskUserQuestionAnswerItem, ...]

    @property
    def answered_by(self) -> str | None:
        """Who answered, as the seal the asker verified names them (a provider's ``by``; for a remembered
        decision, who set it). None for an answer no verified seal names anyone for: built by hand, made
        by an in-process answerer, or settled without a ``by``. Set by the broker only (``answered``)."""
        by: str | None = self.__dict__.get("_answered_by")
        return by


def answered(answer: AskUserQuestionAnswer, by: str) -> AskUserQuestionAnswer:
    """``answer`` naming ``by`` as who answered ('' names nobody): the broker's own, for a seal it verified."""
    if by:
        # Kept beside the fields (the Struct's __dict__): equality, hashing and encoding stay the seeds'.
        answer.__dict__["_answered_by"] = by
    return answer


def _decode_hook(type_: type, obj: Any) -> Any:
    if type_ is AskUserQuestionIntent:  # an intent decoded on its own: msgspec.convert(obj, AskUserQuestionIntent)
        try:
            return _intent(obj)
        except ValueError as error:
            raise msgspec.ValidationError(str(error)) from None
    raise NotImplementedError(type_)


_encoder = msgspec.json.Encoder()
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
    """What a settled request leaves in its per-request key: an answer or an error.

    A provider's outcome is sealed (broker/signing.py): on the wire ``{"signed": <the outcome's
    JSON as a string>, "proof": ...}``; ``decode_outcome`` returns what ``signed`` holds, with
    ``signed`` and ``proof`` kept for the asker to verify.
    """

    answer: AskUserQuestionAnswer | None = None
    error: ErrorPayload | None = None
    signed: str | None = None
    proof: Proof | None = None


_outcome_decoder = msgspec.json.Decoder(Outcome, dec_hook=_decode_hook)


def decode_outcome(data: bytes | str) -> Outcome:
    """Decode an outcome, sealed or not; raises ``msgspec.DecodeError`` on malformed input."""
    outcome = _outcome_decoder.decode(data)
    if outcome.signed is None:
        return outcome
    inner = _outcome_decoder.decode(outcome.signed)
    return Outcome(answer=inner.answer, error=inner.error, signed=outcome.signed, proof=outcome.proof)
