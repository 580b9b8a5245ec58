from __future__ import annotations

from typing import Any

import msgspec
import pytest

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionRequest,
    PlanReviewIntent,
    UnknownIntent,
)
from broker.types import decode_answer, decode_request, encode
from tests.helpers import answer, plan_review, question


def test_wire_names_are_the_seeds_camel_case() -> None:
    request = AskUserQuestionRequest(questions=(question("a", "x", "y", multi=True, header="H"),), agent="root")
    assert msgspec.json.decode(encode(request)) == {
        "questions": [
            {
                "id": "a",
                "question": "question a?",
                "header": "H",
                "options": [{"label": "x"}, {"label": "y"}],
                "multiSelect": True,
            }
        ],
        "agent": "root",
    }


def test_plan_review_intent_round_trips_with_its_kind_tag() -> None:
    request = plan_review()
    data = msgspec.json.decode(encode(request))
    assert data["questions"][0]["intent"] == {"kind": "plan-review", "approve": "Approve"}
    assert decode_request(encode(request)) == request


def test_an_unknown_intent_kind_decodes_and_passes_on_unchanged() -> None:
    raw = b'{"questions":[{"id":"a","question":"q","detail":"d","intent":{"kind":"diff-review","files":["x"]}}]}'
    request = decode_request(raw)
    intent = request.questions[0].intent
    assert isinstance(intent, UnknownIntent)
    assert intent.kind == "diff-review"
    assert msgspec.json.decode(encode(request))["questions"][0]["intent"] == {"kind": "diff-review", "files": ["x"]}


def test_unknown_fields_are_ignored() -> None:
    raw = b'{"questions":[{"id":"a","question":"q","color":"red","options":[{"label":"x","icon":"y"}]}],"v":2}'
    assert decode_request(raw).questions[0].labels == ("x",)
    assert decode_answer(b'{"answers":[{"id":"a","selected":[],"extra":1}],"by":"x"}') == answer(("a", (), None))


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b'{"questions":[{"id":"a","question":"q","intent":"plan"}]}', id="intent-not-object"),
        pytest.param(b'{"questions":[{"id":"a","question":"q","intent":{"approve":"x"}}]}', id="intent-without-kind"),
        pytest.param(b'{"questions":[{"id":1,"question":"q"}]}', id="id-not-string"),
        pytest.param(b'{"questions":"no"}', id="questions-not-list"),
        pytest.param(b"not json", id="not-json"),
    ],
)
def test_malformed_requests_fail_to_decode_with_a_validation_error(raw: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_request(raw)


def test_plan_review_intent_is_a_struct_with_approve() -> None:
    intent = PlanReviewIntent(approve="Go")
    assert msgspec.json.decode(encode(intent)) == {"kind": "plan-review", "approve": "Go"}


def test_answer_skipped_item() -> None:
    result: AskUserQuestionAnswer = answer(("a", (), None), ("b", ("x",), None))
    assert result.answers[0].skipped and not result.answers[1].skipped


_ITEM: dict[str, object] = {
    "id": "a",
    "question": "q",
    "detail": "d",
    "intent": {"kind": "diff-review", "files": ["x"]},
}
_PLAN_ITEM: dict[str, object] = {
    "id": "a",
    "question": "q",
    "detail": "d",
    "intent": {"kind": "plan-review", "approve": "Go"},
}


def _wrap(type_: type, item: dict[str, object]) -> dict[str, object]:
    return item if type_ is AskUserQuestionItem else {"questions": [item], "agent": "root"}


def _intent_of(value: AskUserQuestionItem | AskUserQuestionRequest) -> object:
    return (value if isinstance(value, AskUserQuestionItem) else value.questions[0]).intent


@pytest.mark.parametrize("type_", [AskUserQuestionItem, AskUserQuestionRequest], ids=lambda t: t.__name__)
@pytest.mark.parametrize(
    "decode",
    [
        pytest.param(lambda obj, t: msgspec.json.decode(msgspec.json.encode(obj), type=t), id="json.decode"),
        pytest.param(lambda obj, t: msgspec.msgpack.decode(msgspec.msgpack.encode(obj), type=t), id="msgpack.decode"),
        pytest.param(lambda obj, t: msgspec.convert(obj, t), id="convert"),
    ],
)
def test_msgspec_alone_decodes_unknown_and_known_intents(type_: type, decode: Any) -> None:
    """Issue 16: `msgspec.json.decode(raw, type=AskUserQuestionItem)` failed with
    `Expected AskUserQuestionIntent, got dict` (any intent, not only unknown kinds)."""
    unknown = decode(_wrap(type_, _ITEM), type_)
    intent = _intent_of(unknown)
    assert isinstance(intent, UnknownIntent) and intent.kind == "diff-review"
    assert msgspec.json.decode(msgspec.json.encode(unknown)) == _wrap(type_, _ITEM)  # passed on unchanged
    assert msgspec.json.decode(msgspec.json.encode(msgspec.to_builtins(unknown))) == _wrap(type_, _ITEM)
    known = decode(_wrap(type_, _PLAN_ITEM), type_)
    assert _intent_of(known) == PlanReviewIntent(approve="Go")
    assert msgspec.json.decode(msgspec.json.encode(known)) == _wrap(type_, _PLAN_ITEM)


@pytest.mark.parametrize(
    "intent",
    [
        pytest.param("plan", id="not-object"),
        pytest.param({"approve": "x"}, id="without-kind"),
        pytest.param({"kind": "plan-review"}, id="plan-review-without-approve"),
    ],
)
def test_msgspec_alone_rejects_malformed_intents(intent: object) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"id": "a", "question": "q", "intent": intent}, AskUserQuestionItem)


def test_an_intent_given_as_a_dict_in_python_becomes_the_intent() -> None:
    item = AskUserQuestionItem(id="a", question="q", detail="d", intent={"kind": "plan-review", "approve": "Go"})  # type: ignore[arg-type]
    assert item.intent == PlanReviewIntent(approve="Go")
    assert hash(item) == hash(
        AskUserQuestionItem(id="a", question="q", detail="d", intent=PlanReviewIntent(approve="Go"))
    )


def test_the_intent_field_schema_is_the_intent_schema() -> None:
    from broker.schema import schemas

    generated = schemas()
    field = generated["AskUserQuestionItem"]["$defs"]["AskUserQuestionItem"]["properties"]["intent"]["anyOf"][0]
    standalone = {k: v for k, v in generated["AskUserQuestionIntent"].items() if k not in ("$schema", "$id")}
    assert {k: v for k, v in field.items() if k != "type"} == standalone
