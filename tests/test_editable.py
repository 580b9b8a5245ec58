"""Edit before approve: an approval's arguments offered for editing, and the edit in the answer.

The request's ``editable`` block is checked like the rest of the request (``BAD_REQUEST``); an
edit is checked as JSON against the tool's schema where one is given (``BAD_ANSWER``), and only
goes with the option that approves.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionRequest,
    Editable,
    Limits,
    UserQuestionError,
    check_answer,
    check_request,
)
from broker.types import convert_request, decode_answer, decode_request, encode
from tests.helpers import options

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "force": {"type": "boolean"}},
    "required": ["path"],
    "additionalProperties": False,
}
ARGS = {"path": "build/", "force": True}


def approval(editable: Editable | None = None, *labels: str) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(
        questions=(
            AskUserQuestionItem(
                id="c1",
                question="Allow delete: `build/`?",
                options=options(*(labels or ("Approve", "Deny"))),
                editable=editable
                if editable is not None
                else Editable(arguments=ARGS, approve="Approve", schema=SCHEMA),
            ),
        )
    )


def edited(edit: Any, *selected: str, custom: str | None = None) -> AskUserQuestionAnswer:
    return AskUserQuestionAnswer(
        answers=(AskUserQuestionAnswerItem(id="c1", selected=selected, custom=custom, edited=edit),)
    )


def test_editable_and_edited_round_trip_on_the_wire() -> None:
    request = approval()
    raw = encode(request)
    assert b'"editable":{"arguments":{"path":"build/","force":true},"approve":"Approve","schema":' in raw
    assert decode_request(raw) == request
    answer = edited({"path": "dist/"}, "Approve")
    assert b'"edited":{"path":"dist/"}' in encode(answer)
    assert decode_answer(encode(answer)) == answer


def test_an_older_peer_ignores_the_fields() -> None:
    """A peer that does not know `editable`/`edited` decodes the rest (types.py's rule, both ways)."""

    class OldItem(msgspec.Struct, rename="camel"):
        id: str
        question: str

    class OldAnswerItem(msgspec.Struct):
        id: str
        selected: list[str]

    assert msgspec.json.decode(encode(approval().questions[0]), type=OldItem).id == "c1"
    assert msgspec.json.decode(encode(edited({"path": "x"}, "Approve").answers[0]), type=OldAnswerItem).selected == [
        "Approve"
    ]
    # and a request without the block is byte for byte what it was
    plain = AskUserQuestionItem(id="c1", question="q", options=options("Approve", "Deny"))
    assert b"editable" not in encode(plain)


def code_of(request: AskUserQuestionRequest) -> str | None:
    try:
        check_request(request, Limits())
    except UserQuestionError as error:
        return error.code
    return None


@pytest.mark.parametrize(
    ("editable", "code"),
    [
        pytest.param(Editable(arguments=ARGS, approve="Approve", schema=SCHEMA), None, id="with-schema"),
        pytest.param(Editable(arguments=ARGS, approve="Approve"), None, id="without-schema"),
        pytest.param(Editable(arguments={"x": 1}, approve="Approve", schema=SCHEMA), None, id="args-not-checked"),
        pytest.param(Editable(arguments=ARGS, approve="Go"), "BAD_REQUEST", id="approve-names-no-option"),
        pytest.param(
            Editable(arguments=ARGS, approve="Approve", schema={"type": "no-such-type"}),
            "BAD_REQUEST",
            id="schema-not-a-schema",
        ),
    ],
)
def test_the_editable_block_is_checked(editable: Editable, code: str | None) -> None:
    assert code_of(approval(editable)) == code


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param({"arguments": "rm -rf /", "approve": "Approve"}, id="arguments-not-an-object"),
        pytest.param({"arguments": {}}, id="approve-missing"),
        pytest.param({"arguments": {}, "approve": "Approve", "schema": True}, id="schema-not-an-object"),
    ],
)
def test_a_malformed_editable_block_does_not_decode(raw: dict[str, Any]) -> None:
    """The asking side turns a decode failure into BAD_REQUEST (as for any malformed request)."""
    request = {"questions": [{"id": "c1", "question": "q", "options": [{"label": "Approve"}], "editable": raw}]}
    with pytest.raises(msgspec.ValidationError, match="editable"):
        convert_request(request)


def test_a_question_without_options_cannot_be_editable() -> None:
    item = AskUserQuestionItem(id="c1", question="q", editable=Editable(arguments={}, approve="Approve"))
    assert code_of(AskUserQuestionRequest(questions=(item,))) == "BAD_REQUEST"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param(edited({"path": "dist/"}, "Approve"), None, id="approve-with-edit"),
        pytest.param(edited(None, "Approve"), None, id="approve-unedited"),
        pytest.param(edited(None, "Deny"), None, id="deny"),
        pytest.param(edited({"path": "dist/"}, "Deny"), "only with 'Approve'", id="edit-with-deny"),
        pytest.param(edited({"path": "dist/"}, custom="no"), "only with 'Approve'", id="edit-with-note"),
        pytest.param(edited({"path": "dist/"}), "only with 'Approve'", id="edit-with-skip"),
        pytest.param(edited({"force": True}, "Approve"), "'path' is a required property", id="schema-required"),
        pytest.param(edited({"path": 3}, "Approve"), "3 is not of type 'string'", id="schema-type"),
        pytest.param(edited({"path": "a", "x": 1}, "Approve"), "Additional properties", id="schema-extra"),
    ],
)
def test_an_edit_is_checked_against_the_schema_and_the_choice(
    answer: AskUserQuestionAnswer, message: str | None
) -> None:
    if message is None:
        assert check_answer(approval(), answer) == answer
        return
    with pytest.raises(UserQuestionError, match=message) as raised:
        check_answer(approval(), answer)
    assert raised.value.code == "BAD_ANSWER"


def test_without_a_schema_any_object_is_an_edit() -> None:
    request = approval(Editable(arguments=ARGS, approve="Approve"))
    answer = edited({"anything": [1, 2]}, "Approve")
    assert check_answer(request, answer) == answer


def test_an_edit_to_a_question_that_offers_none_is_refused() -> None:
    request = AskUserQuestionRequest(
        questions=(AskUserQuestionItem(id="c1", question="q", options=options("Approve", "Deny")),)
    )
    with pytest.raises(UserQuestionError, match="offers no edit") as raised:
        check_answer(request, edited({"path": "x"}, "Approve"))
    assert raised.value.code == "BAD_ANSWER"


def test_an_edit_over_the_size_limit_is_refused() -> None:
    request = approval(Editable(arguments=ARGS, approve="Approve"))
    with pytest.raises(UserQuestionError, match="bytes") as raised:
        check_answer(request, edited({"path": "x" * 2000}, "Approve"), Limits(max_edited_bytes=1000))
    assert raised.value.code == "BAD_ANSWER"


def test_a_schema_that_cannot_be_applied_refuses_the_edit_not_the_provider() -> None:
    """An unresolvable `$ref` (never fetched from the network) fails the edit with BAD_ANSWER."""
    request = approval(
        Editable(arguments=ARGS, approve="Approve", schema={"$ref": "https://example.invalid/tool.json"})
    )
    with pytest.raises(UserQuestionError, match="schema") as raised:
        check_answer(request, edited({"path": "x"}, "Approve"))
    assert raised.value.code == "BAD_ANSWER"


def test_an_edited_answer_is_never_remembered() -> None:
    """A remembered decision answers later calls with other arguments: an edit is for this call only."""
    from broker import Remember
    from broker.decisions import why_not_rememberable

    why = why_not_rememberable(approval(), edited({"path": "dist/"}, "Approve"), Remember(), opted_out=False)
    assert why is not None and "edited" in why
    assert why_not_rememberable(approval(), edited(None, "Approve"), Remember(), opted_out=False) is None


def test_approvals_of_different_arguments_are_never_one_card() -> None:
    """Coalescing: the same question text over other arguments is another card (one edit, one call)."""
    from broker.answering._schedule import request_fingerprint

    other = approval(Editable(arguments={"path": "src/"}, approve="Approve", schema=SCHEMA))
    assert request_fingerprint(approval()) != request_fingerprint(other)
    assert request_fingerprint(approval()) == request_fingerprint(approval())
    plain = AskUserQuestionRequest(questions=(AskUserQuestionItem(id="a", question="q"),))
    # a request without the block keeps the fingerprint every provider computes today
    assert request_fingerprint(plain) == __import__("hashlib").sha256(b'[["q",null,null,[],false,null]]').hexdigest()
