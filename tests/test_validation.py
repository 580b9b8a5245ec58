from __future__ import annotations

import pytest

from broker import (
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Limits,
    PlanReviewIntent,
    UserQuestionError,
    check_answer,
    check_request,
)
from broker.types import UnknownIntent
from tests.helpers import answer, question

LIMITS = Limits(max_questions=3, max_options=3, max_label_chars=10, max_request_bytes=4096)


def request_of(*items: AskUserQuestionItem) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(questions=items)


def code_of(request: AskUserQuestionRequest) -> str | None:
    try:
        check_request(request, LIMITS)
    except UserQuestionError as error:
        return error.code
    return None


PLAN = PlanReviewIntent(approve="Yes")


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        pytest.param(request_of(question("a", "Yes", "No")), None, id="plain"),
        pytest.param(request_of(question("a", "Yes", "No", detail="plan", intent=PLAN)), None, id="plan-review"),
        pytest.param(
            request_of(question("a", "Go", "No", detail="plan", intent=PLAN)),
            "BAD_INTENT",
            id="approve-names-no-option",
        ),
        pytest.param(request_of(question("a", detail="plan", intent=PLAN)), "BAD_INTENT", id="approve-without-options"),
        pytest.param(request_of(question("a", "Yes", "No", intent=PLAN)), "BAD_INTENT", id="intent-without-detail"),
        pytest.param(
            request_of(question("a", "x", intent=UnknownIntent("new", {"kind": "new"}))),
            "BAD_INTENT",
            id="unknown-intent-without-detail",
        ),
        pytest.param(
            request_of(question("a", "x", detail="d", intent=UnknownIntent("new", {"kind": "new"}))),
            None,
            id="unknown-intent-with-detail",
        ),
        pytest.param(
            request_of(question("a", "Go", intent=PLAN), question("", "x")),
            "BAD_INTENT",
            id="intent-checked-before-structure",
        ),
        pytest.param(request_of(question("a"), question("a")), "BAD_REQUEST", id="duplicate-ids"),
        pytest.param(request_of(question(" ")), "BAD_REQUEST", id="empty-id"),
        pytest.param(request_of(question("a", "x", "x")), "BAD_REQUEST", id="duplicate-labels"),
        pytest.param(request_of(question("a", "")), "BAD_REQUEST", id="empty-label"),
        pytest.param(request_of(*(question(str(i)) for i in range(4))), "BAD_REQUEST", id="too-many-questions"),
        pytest.param(request_of(question("a", "1", "2", "3", "4")), "BAD_REQUEST", id="too-many-options"),
        pytest.param(request_of(question("a", "x" * 11)), "BAD_REQUEST", id="label-too-long"),
        pytest.param(request_of(question("a", detail="d" * 5000)), "BAD_REQUEST", id="request-too-large"),
    ],
)
def test_request_rules(request_: AskUserQuestionRequest, code: str | None) -> None:
    assert code_of(request_) == code


def test_intent_rules_run_per_question_in_order_approve_first() -> None:
    request = request_of(question("a", "x", intent=PLAN))  # both faults: approve and detail
    with pytest.raises(UserQuestionError, match="approve"):
        check_request(request, LIMITS)


SINGLE = question("s", "A", "B")
MULTI = question("m", "A", "B", "C", multi=True)
FREE = question("f")
BATCH = request_of(SINGLE, MULTI, FREE)


@pytest.mark.parametrize(
    ("items", "ok"),
    [
        pytest.param([("s", ("A",), None), ("m", ("A", "C"), None), ("f", (), "text")], True, id="valid"),
        pytest.param([("f", (), None), ("m", (), None), ("s", (), None)], True, id="all-skipped-any-order"),
        pytest.param([("s", (), "other"), ("m", ("B",), "also"), ("f", (), None)], True, id="custom-rules"),
        pytest.param([("s", ("A",), "other"), ("m", (), None), ("f", (), None)], False, id="single-custom-with-label"),
        pytest.param([("s", ("A", "B"), None), ("m", (), None), ("f", (), None)], False, id="single-two-labels"),
        pytest.param([("s", ("Z",), None), ("m", (), None), ("f", (), None)], False, id="unknown-label"),
        pytest.param([("s", (), None), ("m", ("A", "A"), None), ("f", (), None)], False, id="label-twice"),
        pytest.param([("s", (), None), ("m", (), None), ("f", ("x",), None)], False, id="label-on-free-question"),
        pytest.param([("s", (), "  "), ("m", (), None), ("f", (), None)], False, id="blank-custom"),
        pytest.param([("s", (), None), ("m", (), None)], False, id="missing-id"),
        pytest.param([("s", (), None), ("m", (), None), ("f", (), None), ("x", (), None)], False, id="unknown-id"),
        pytest.param([("s", (), None), ("s", (), None), ("m", (), None), ("f", (), None)], False, id="repeated-id"),
    ],
)
def test_answer_rules(items: list[tuple[str, tuple[str, ...], str | None]], ok: bool) -> None:
    given = answer(*items)
    if ok:
        accepted = check_answer(BATCH, given)
        assert [item.id for item in accepted.answers] == ["s", "m", "f"]  # question order
    else:
        with pytest.raises(UserQuestionError) as raised:
            check_answer(BATCH, given)
        assert raised.value.code == "BAD_ANSWER"


def test_option_descriptions_are_not_labels() -> None:
    item = AskUserQuestionItem(id="a", question="q", options=(AskUserQuestionOption(label="x", description="y"),))
    with pytest.raises(UserQuestionError):
        check_answer(request_of(item), answer(("a", ("y",), None)))
