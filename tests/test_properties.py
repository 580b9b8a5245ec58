"""Property-based tests over requests and answers (hypothesis).

Validation and decoding never crash on hostile input: they accept, or refuse with a
``UserQuestionError`` whose code is in ``ERROR_CODES``, or (decoding only) raise
``msgspec.ValidationError`` / ``DecodeError``. ``check_answer`` and ``check_request`` accept
exactly what independent reference predicates, written from DESIGN.md's rules, accept.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import (
    ERROR_CODES,
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Limits,
    PlanReviewIntent,
    UnknownIntent,
    UserQuestionError,
    check_answer,
    check_request,
)
from broker.types import convert_answer, convert_request, decode_answer, decode_request, encode

# Reproducible in CI: the same examples on every run, none stored between runs.
PROPERTY = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Small alphabets make collisions (duplicate ids and labels, blank text) common.
WORDS = st.sampled_from(["a", "b", "Yes", "No", "", " ", "\t", "ü", "a b", "x" * 12])
TEXT = st.one_of(WORDS, st.text(max_size=15))
OPTIONAL_TEXT = st.none() | TEXT
LIMIT_FIELDS = [name for name in Limits.__struct_fields__]


@st.composite
def limits_strategy(draw: st.DrawFn) -> Limits:
    """The defaults (half the time), or one limit made small so that input crosses it often, and alone."""
    name = draw(st.sampled_from([None] * len(LIMIT_FIELDS) + LIMIT_FIELDS))
    if name is None:
        return Limits()
    top = {"max_request_bytes": 400, "max_questions": 4, "max_options": 4, "max_id_chars": 3}.get(name, 10)
    small = draw(st.integers(top // 10, top))
    return Limits(**{name: small})


LIMITS = limits_strategy()
LABEL = st.text(st.characters(codec="utf-8", categories=["L", "N"]), min_size=1, max_size=8)


def options_and_intent(labels: list[str]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.builds(PlanReviewIntent, approve=st.sampled_from(labels) if labels else TEXT),
        st.builds(PlanReviewIntent, approve=TEXT),
        st.sampled_from(["new-kind", "plan-review-v2", ""]).map(lambda k: UnknownIntent(k, {"kind": k, "x": 1})),
    )


@st.composite
def random_items(draw: st.DrawFn) -> AskUserQuestionItem:
    labels = draw(st.lists(TEXT, max_size=5))
    options = tuple(AskUserQuestionOption(label=label, description=draw(OPTIONAL_TEXT)) for label in labels)
    return AskUserQuestionItem(
        id=draw(WORDS),
        question=draw(TEXT),
        detail=draw(OPTIONAL_TEXT),
        header=draw(OPTIONAL_TEXT),
        options=options or draw(st.sampled_from([None, ()])),
        multi_select=draw(st.booleans()),
        intent=draw(options_and_intent(labels)),
    )


@st.composite
def valid_items(draw: st.DrawFn, index: int) -> AskUserQuestionItem:
    labels = draw(st.lists(LABEL, max_size=4, unique=True))
    intent = draw(
        st.none()
        | (st.builds(PlanReviewIntent, approve=st.sampled_from(labels)) if labels else st.none())
        | st.just(UnknownIntent("new-kind", {"kind": "new-kind"}))
    )
    return AskUserQuestionItem(
        id=f"q{index}",
        question=draw(LABEL),
        detail=draw(LABEL) if intent is not None else draw(st.none() | LABEL),
        header=draw(st.none() | LABEL),
        options=tuple(AskUserQuestionOption(label=label, description=draw(st.none() | LABEL)) for label in labels)
        or None,
        multi_select=draw(st.booleans()),
        intent=intent,
    )


def with_item(request: AskUserQuestionRequest, index: int, **changes: Any) -> AskUserQuestionRequest:
    questions = list(request.questions)
    questions[index] = msgspec.structs.replace(questions[index], **changes)
    return msgspec.structs.replace(request, questions=tuple(questions))


@st.composite
def near_valid_requests(draw: st.DrawFn) -> AskUserQuestionRequest:
    """A valid request, then (half the time) one fault."""
    count = draw(st.integers(1, 4))
    request = AskUserQuestionRequest(
        questions=tuple(draw(valid_items(i)) for i in range(count)), agent=draw(st.none() | LABEL)
    )
    fault = draw(st.sampled_from([None] * 8 + ["dup-id", "blank-id", "dup-label", "blank-label", "approve",
                                               "no-detail", "blank-agent", "random-item"]))  # fmt: skip
    i = draw(st.integers(0, count - 1))
    item = request.questions[i]
    if fault == "dup-id" and count > 1:
        request = with_item(request, i, id=request.questions[(i + 1) % count].id)
    elif fault == "blank-id":
        request = with_item(request, i, id=draw(st.sampled_from(["", " ", "\t\n"])))
    elif fault in ("dup-label", "blank-label") and item.options:
        extra = item.options[0] if fault == "dup-label" else AskUserQuestionOption(label=" ")
        request = with_item(request, i, options=(*item.options, extra))
    elif fault == "approve":
        request = with_item(request, i, intent=PlanReviewIntent(approve=draw(TEXT)))
    elif fault == "no-detail":
        request = with_item(request, i, intent=UnknownIntent("k", {"kind": "k"}), detail=None)
    elif fault == "blank-agent":
        request = msgspec.structs.replace(request, agent=draw(st.sampled_from(["", "  "])))
    elif fault == "random-item":
        request = with_item(request, i, **msgspec.structs.asdict(draw(random_items())))
    return request


REQUESTS = st.one_of(
    near_valid_requests(),
    st.builds(AskUserQuestionRequest, questions=st.lists(random_items(), max_size=5).map(tuple), agent=OPTIONAL_TEXT),
)


@st.composite
def answers_for(draw: st.DrawFn, request: AskUserQuestionRequest) -> AskUserQuestionAnswer:
    """A valid answer, then (half the time) one fault; in any order."""
    custom_text = LABEL | st.text(max_size=30).filter(lambda t: t.strip())
    answer_items: list[AskUserQuestionAnswerItem] = []
    for item in request.questions:
        labels = list(item.labels)
        selected: list[str] = []
        custom = None
        if labels and item.multi_select:
            selected = draw(st.lists(st.sampled_from(labels), unique=True))
            custom = draw(st.none() | custom_text)
        else:
            choice = draw(st.sampled_from(["label", "custom", "skip"] if labels else ["custom", "skip"]))
            if choice == "label":
                selected = [draw(st.sampled_from(labels))]
            elif choice == "custom":
                custom = draw(custom_text)
        answer_items.append(AskUserQuestionAnswerItem(id=item.id, selected=tuple(selected), custom=custom))
    fault = draw(st.sampled_from([None] * 8 + ["missing", "repeated", "unknown-id", "stray-label", "label-twice",
                                               "blank-custom", "custom-and-label", "two-labels", "random"]))  # fmt: skip
    if answer_items and fault is not None:
        i = draw(st.integers(0, len(answer_items) - 1))
        one = answer_items[i]
        labels = list(request.questions[i].labels) or ["no-such-label"]
        if fault == "missing":
            del answer_items[i]
        elif fault == "repeated":
            answer_items.append(one)
        elif fault == "unknown-id":
            answer_items[i] = msgspec.structs.replace(one, id=draw(WORDS))
        elif fault == "stray-label":
            answer_items[i] = msgspec.structs.replace(one, selected=(*one.selected, draw(TEXT)))
        elif fault == "label-twice":
            answer_items[i] = msgspec.structs.replace(one, selected=(*one.selected, labels[0], labels[0]))
        elif fault == "blank-custom":
            answer_items[i] = msgspec.structs.replace(one, custom=draw(st.sampled_from(["", " ", "\u2003\n"])))
        elif fault == "custom-and-label":
            answer_items[i] = msgspec.structs.replace(one, selected=labels[:1], custom=draw(custom_text))
        elif fault == "two-labels":
            answer_items[i] = msgspec.structs.replace(one, selected=tuple(labels[:2]))
        else:
            answer_items[i] = AskUserQuestionAnswerItem(
                id=draw(WORDS), selected=tuple(draw(st.lists(TEXT, max_size=3))), custom=draw(st.none() | TEXT)
            )
    return AskUserQuestionAnswer(answers=tuple(draw(st.permutations(answer_items))))


# ---- independent reference predicates, from DESIGN.md ("What ask() checks", "What a provider accepts")


def blank(text: str) -> bool:
    return all(char.isspace() for char in text)


def reference_request_code(request: AskUserQuestionRequest, limits: Limits) -> str | None:
    """The code check_request must give, or None. Intent rules (per question, in order) come first."""
    for item in request.questions:
        if item.intent is None:
            continue
        if isinstance(item.intent, PlanReviewIntent) and item.intent.approve not in item.labels:
            return "BAD_INTENT"
        if item.detail is None or not item.detail.strip():  # a blank detail is no detail
            return "BAD_INTENT"
    faults = [
        len(request.questions) > limits.max_questions,
        len({item.id for item in request.questions}) != len(request.questions),
        request.agent is not None and blank(request.agent),
        len(encode(request)) > limits.max_request_bytes,
    ]
    for item in request.questions:
        labels = item.labels
        faults += [
            blank(item.id),
            len(item.id) > limits.max_id_chars,
            len(item.question) > limits.max_text_chars,
            len(item.header or "") > limits.max_text_chars,
            len(item.detail or "") > limits.max_detail_chars,
            len(labels) > limits.max_options,
            len(set(labels)) != len(labels),
            any(blank(label) or len(label) > limits.max_label_chars for label in labels),
            any(len(option.description or "") > limits.max_text_chars for option in item.options or ()),
        ]
    return "BAD_REQUEST" if any(faults) else None


def reference_answer_ok(request: AskUserQuestionRequest, answer: AskUserQuestionAnswer, limits: Limits) -> bool:
    """For a request with distinct question ids."""
    given_ids = [item.id for item in answer.answers]
    if sorted(given_ids) != sorted(item.id for item in request.questions):
        return False  # every question id exactly once: no unknown, missing or repeated ids
    by_id = {item.id: item for item in answer.answers}
    for question in request.questions:
        given = by_id[question.id]
        if len(set(given.selected)) != len(given.selected) or not set(given.selected) <= set(question.labels):
            return False
        if not question.multi_select and (len(given.selected) > 1 or (given.custom is not None and given.selected)):
            return False
        if given.custom is not None and (blank(given.custom) or len(given.custom) > limits.max_custom_chars):
            return False
    return True


def refusal_code(call: Any, *args: Any) -> str | None:
    try:
        call(*args)
    except UserQuestionError as error:
        assert error.code in ERROR_CODES and error.message and str(error).startswith(error.code)
        assert error.to_dict() == {"name": "UserQuestionError", "code": error.code, "message": error.message}
        return error.code
    return None


# ---- properties


@PROPERTY
@given(request=REQUESTS, limits=LIMITS)
def test_check_request_refuses_exactly_what_the_rules_refuse(request: AskUserQuestionRequest, limits: Limits) -> None:
    assert refusal_code(check_request, request, limits) == reference_request_code(request, limits)


@PROPERTY
@given(data=st.data(), request=REQUESTS, limits=LIMITS)
def test_check_answer_accepts_exactly_the_valid_answers(
    data: st.DataObject, request: AskUserQuestionRequest, limits: Limits
) -> None:
    answer = data.draw(answers_for(request))
    try:
        accepted = check_answer(request, answer, limits)
    except UserQuestionError as error:
        assert error.code == "BAD_ANSWER" and error.message
        accepted = None
    if len({item.id for item in request.questions}) != len(request.questions):
        return  # such a request never reaches a provider (BAD_REQUEST); only "no crash" holds
    assert (accepted is not None) == reference_answer_ok(request, answer, limits), (request, answer)
    if accepted is not None:  # the same items, in question order
        assert [item.id for item in accepted.answers] == [item.id for item in request.questions]
        assert sorted(accepted.answers, key=lambda i: i.id) == sorted(answer.answers, key=lambda i: i.id)


def measured(request: AskUserQuestionRequest) -> dict[str, int]:
    """The size of a request in each limited dimension (written from Limits' documentation)."""
    items = request.questions
    options = [option for item in items for option in item.options or ()]
    texts = [item.question for item in items] + [t for item in items for t in (item.header,) if t is not None]
    texts += [option.description for option in options if option.description is not None]
    return {
        "max_questions": len(items),
        "max_options": max((len(item.options or ()) for item in items), default=0),
        "max_id_chars": max((len(item.id) for item in items), default=0),
        "max_label_chars": max((len(option.label) for option in options), default=0),
        "max_text_chars": max(map(len, texts), default=0),
        "max_detail_chars": max((len(item.detail or "") for item in items), default=0),
        "max_request_bytes": len(encode(request)),
    }


@PROPERTY
@given(request=near_valid_requests())
def test_every_size_limit_is_enforced_at_its_boundary(request: AskUserQuestionRequest) -> None:
    if reference_request_code(request, Limits()) is not None:
        return
    for name, size in measured(request).items():
        assert refusal_code(check_request, request, Limits(**{name: size})) is None, name
        if size > 0:
            assert refusal_code(check_request, request, Limits(**{name: size - 1})) == "BAD_REQUEST", name


def test_the_answer_strategy_produces_both_verdicts() -> None:
    """Guards the property above against a strategy that only ever makes one kind of answer."""
    verdicts: set[bool] = set()

    @PROPERTY
    @given(data=st.data(), request=REQUESTS)
    def collect(data: st.DataObject, request: AskUserQuestionRequest) -> None:
        if request.questions and len({item.id for item in request.questions}) == len(request.questions):
            verdicts.add(reference_answer_ok(request, data.draw(answers_for(request)), Limits()))

    collect()
    assert verdicts == {True, False}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)


def near(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape, sometimes any JSON value."""
    return st.one_of(valid, valid, JSON)


OPTION_DICTS = st.fixed_dictionaries({"label": near(TEXT)}, optional={"description": near(TEXT), "extra": JSON})
INTENT_DICTS = st.fixed_dictionaries(
    {"kind": near(st.sampled_from(["plan-review", "other", ""]))}, optional={"approve": near(TEXT), "more": JSON}
)
ITEM_DICTS = st.fixed_dictionaries(
    {"id": near(TEXT), "question": near(TEXT)},
    optional={
        "detail": near(OPTIONAL_TEXT),
        "header": near(OPTIONAL_TEXT),
        "options": near(st.none() | st.lists(near(OPTION_DICTS), max_size=4)),
        "multiSelect": near(st.booleans()),
        "intent": near(st.none() | INTENT_DICTS),
        "futureField": JSON,
    },
)
REQUEST_DICTS = near(
    st.fixed_dictionaries(
        {"questions": near(st.lists(near(ITEM_DICTS), max_size=4))}, optional={"agent": near(OPTIONAL_TEXT)}
    )
)
ANSWER_DICTS = near(
    st.fixed_dictionaries(
        {
            "answers": near(
                st.lists(
                    near(
                        st.fixed_dictionaries(
                            {"id": near(TEXT), "selected": near(st.lists(near(TEXT), max_size=3))},
                            optional={"custom": near(OPTIONAL_TEXT)},
                        )
                    ),
                    max_size=4,
                )
            )
        }
    )
)


@PROPERTY
@given(obj=REQUEST_DICTS, answer_obj=ANSWER_DICTS, limits=LIMITS)
def test_decoding_then_checking_json_only_raises_coded_errors(obj: Any, answer_obj: Any, limits: Limits) -> None:
    # convert_* raise ValidationError only; decode_* also DecodeError (json.dumps writes Infinity)
    decoders = (
        (convert_request, msgspec.ValidationError),
        (lambda o: decode_request(json.dumps(o)), msgspec.DecodeError),
    )
    answer_decoders = (
        (convert_answer, msgspec.ValidationError),
        (lambda o: decode_answer(json.dumps(o)), msgspec.DecodeError),
    )
    for decode, expected in decoders:
        try:
            request = decode(obj)
        except expected:
            continue
        assert refusal_code(check_request, request, limits) in {None, "BAD_INTENT", "BAD_REQUEST"}
        assert decode_request(encode(request)) == request  # what decodes, re-encodes to the same value
        for decode_answer_, expected_ in answer_decoders:
            try:
                answer = decode_answer_(answer_obj)
            except expected_:
                continue
            assert refusal_code(check_answer, request, answer, limits) in {None, "BAD_ANSWER"}


@PROPERTY
@given(data=st.binary(max_size=200) | st.text(max_size=200))
def test_arbitrary_bytes_decode_or_raise_decode_error(data: bytes | str) -> None:
    for decode in (decode_request, decode_answer):
        with contextlib.suppress(msgspec.DecodeError):  # ValidationError is a DecodeError
            decode(data)


@PROPERTY
@given(request=REQUESTS)
def test_generated_requests_round_trip_through_json(request: AskUserQuestionRequest) -> None:
    assert decode_request(encode(request)) == request
    assert convert_request(json.loads(encode(request))) == request


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_every_code_survives_the_wire(code: str) -> None:
    error = UserQuestionError("m", code)
    restored = UserQuestionError.from_payload(
        msgspec.json.decode(encode(error.to_payload()), type=type(error.to_payload()))
    )
    assert (restored.code, restored.message) == (code, "m")
