from __future__ import annotations

import msgspec
import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, PlanReviewIntent, UnknownIntent
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
