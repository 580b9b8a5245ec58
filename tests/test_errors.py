from __future__ import annotations

from broker import ERROR_CODES, HarnessError, UserQuestionError
from broker.errors import ErrorPayload


def test_error_carries_name_code_and_reads_code_first() -> None:
    error = UserQuestionError("nothing to ask", "EMPTY_QUESTIONS")
    assert isinstance(error, HarnessError)
    assert error.code == "EMPTY_QUESTIONS"
    assert error.name == "UserQuestionError"
    assert str(error).startswith("EMPTY_QUESTIONS: ")
    assert error.to_dict() == {"name": "UserQuestionError", "code": "EMPTY_QUESTIONS", "message": "nothing to ask"}


def test_an_error_from_the_wire_is_restored_with_the_original_as_cause() -> None:
    payload = ErrorPayload(name="UserQuestionError", code="ASK_CANCELLED", message="dismissed")
    error = UserQuestionError.from_payload(payload)
    assert isinstance(error, UserQuestionError)
    assert error.code == "ASK_CANCELLED"
    assert "dismissed" in str(error.__cause__)


def test_the_seeds_codes_and_ours_are_all_known() -> None:
    seeds = {"ASK_ABORTED", "EMPTY_QUESTIONS", "CALLER_NOT_LIVE", "DELEGATED_CALLER", "BAD_INTENT", "NO_PROVIDER"}
    ours = {"DUPLICATE_PROVIDER", "ASK_CANCELLED", "ASK_TIMED_OUT", "BAD_REQUEST", "BAD_ANSWER", "NOT_PENDING"}
    assert seeds | ours | {"LEASE_LOST"} <= ERROR_CODES
