"""The published JSON Schemas: fresh, and they accept what the broker writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, UnknownIntent, UserQuestionError
from broker.schema import WIRE_TYPES, render, schemas, write
from broker.types import Outcome, convert_request, encode
from tests.helpers import answer, one_question, plan_review, question

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "docs" / "schema"


def test_committed_schemas_are_fresh() -> None:
    expected = {f"{name}.json": render(schema) for name, schema in schemas().items()}
    committed = {path.name: path.read_text(encoding="utf-8") for path in SCHEMA_DIR.glob("*.json")}
    assert committed.keys() == expected.keys(), "run: python -m broker.schema docs/schema"
    stale = sorted(name for name in expected if committed[name] != expected[name])
    assert not stale, f"stale schemas {stale}; run: python -m broker.schema docs/schema"


def test_write_creates_one_file_per_wire_type(tmp_path: Path) -> None:
    written = write(tmp_path / "schema")
    assert sorted(p.stem for p in written) == sorted(t.__name__ for t in WIRE_TYPES)


def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = schemas()[name]
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def _wire(value: Any) -> Any:
    return json.loads(encode(value))


VALID_REQUESTS = {
    "plain": one_question("yes", "no", agent="agent-1"),
    "plan-review": plan_review(),
    "multi-select": AskUserQuestionRequest(questions=(question("q1", "a", "b", multi=True, header="H"),)),
    "unknown-intent": convert_request(
        {"questions": [{"id": "q", "question": "?", "intent": {"kind": "diff-review", "files": ["a.py"]}}]}
    ),
}


@pytest.mark.parametrize("request_", VALID_REQUESTS.values(), ids=VALID_REQUESTS.keys())
def test_requests_the_broker_writes_validate(request_: AskUserQuestionRequest) -> None:
    _validator("AskUserQuestionRequest").validate(_wire(request_))


def test_unknown_intent_round_trips_through_the_schema() -> None:
    wire = _wire(VALID_REQUESTS["unknown-intent"])
    assert wire["questions"][0]["intent"] == {"kind": "diff-review", "files": ["a.py"]}
    assert isinstance(convert_request(wire).questions[0].intent, UnknownIntent)


INVALID_REQUESTS: dict[str, Any] = {
    "no-questions-field": {},
    "question-without-id": {"questions": [{"question": "?"}]},
    "intent-without-kind": {"questions": [{"id": "q", "question": "?", "intent": {"approve": "x"}}]},
    "plan-review-without-approve": {"questions": [{"id": "q", "question": "?", "intent": {"kind": "plan-review"}}]},
    "option-without-label": {"questions": [{"id": "q", "question": "?", "options": [{"description": "d"}]}]},
}


@pytest.mark.parametrize("wire", INVALID_REQUESTS.values(), ids=INVALID_REQUESTS.keys())
def test_malformed_requests_are_rejected(wire: Any) -> None:
    assert not _validator("AskUserQuestionRequest").is_valid(wire)


def test_outcomes_validate() -> None:
    validator = _validator("Outcome")
    picked: AskUserQuestionAnswer = answer(("q1", ("yes",), None), ("q2", (), "other text"), ("q3", (), None))
    validator.validate(_wire(Outcome(answer=picked)))
    validator.validate(_wire(Outcome(error=UserQuestionError("dismissed", "ASK_CANCELLED").to_payload())))
    _validator("AskUserQuestionAnswer").validate(_wire(picked))
    assert not validator.is_valid({"error": {"code": "ASK_CANCELLED"}})
