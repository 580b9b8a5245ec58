"""What the page is sent: sanitised markdown and the plan-review card's conditions."""

from __future__ import annotations

from typing import Any

import pytest

from broker import AskUserQuestionItem, AskUserQuestionOption, PlanReviewIntent, UnknownIntent
from workers.answering.web.render import plan_review, render_markdown, request_view


@pytest.mark.parametrize(
    ("markdown", "forbidden"),
    [
        ("<script>alert(1)</script>", "<script"),
        ('<img src=x onerror="alert(1)">', "<img"),
        ("[x](javascript:alert(1))", 'href="javascript'),
        ("[x](JaVaScRiPt:alert(1))", "href="),
        ("[x](data:text/html;base64,PHNjcmlwdD4=)", "href="),
        ("![tracker](https://example.org/pixel.png)", "<img"),
        ('<a href="https://example.org" onclick="alert(1)">x</a>', "<a"),
        ("<iframe src=https://example.org></iframe>", "<iframe"),
    ],
    ids=[
        "script",
        "img-onerror",
        "javascript-link",
        "mixed-case-scheme",
        "data-link",
        "remote-image",
        "raw-a",
        "iframe",
    ],
)
def test_markdown_is_sanitised(markdown: str, forbidden: str) -> None:
    assert forbidden not in render_markdown(markdown).lower()


def test_markdown_keeps_safe_formatting() -> None:
    html = render_markdown("# Plan\n\n1. **bold** and `code`\n\n[docs](https://example.org/a?b=1)\n\n```\nx < y\n```")
    assert "<h1>Plan</h1>" in html
    assert "<strong>bold</strong>" in html and "<code>code</code>" in html
    assert '<a href="https://example.org/a?b=1" rel="noopener noreferrer nofollow">docs</a>' in html
    assert "x &lt; y" in html


def item(
    *labels: str, approve: str = "Approve", multi: bool = False, detail: str | None = "plan"
) -> AskUserQuestionItem:
    return AskUserQuestionItem(
        id="p",
        question="ok?",
        detail=detail,
        options=tuple(AskUserQuestionOption(label=label) for label in labels),
        multi_select=multi,
        intent=PlanReviewIntent(approve=approve),
    )


def test_plan_review_card_when_the_conditions_hold() -> None:
    assert plan_review(item("Refuse", "Approve"), 1) == {
        "approve": "Approve", "refuse": "Refuse", "approveText": "Approve", "refuseText": "Refuse",
    }  # fmt: skip
    assert plan_review(item("Approve"), 1) == {
        "approve": "Approve", "refuse": None, "approveText": "Approve", "refuseText": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("question", "count"),
    [
        (item("Approve", "Refuse"), 2),
        (item("Approve", "Refuse", "Later"), 1),
        (item("Approve", "Refuse", multi=True), 1),
        (item("Approve", "Refuse", detail=None), 1),
        (AskUserQuestionItem(id="p", question="?", detail="d", intent=UnknownIntent("poll", {"kind": "poll"})), 1),
    ],
    ids=["two-questions", "three-options", "multi-select", "no-detail", "unknown-intent"],
)
def test_generic_form_otherwise(question: AskUserQuestionItem, count: int) -> None:
    assert plan_review(question, count) is None


def test_history_orders_the_two_streams_asker_first_within_a_millisecond() -> None:
    """Each stream numbers its own entries within a millisecond: "1-0" of the audit and "1-0" of the
    askers' log say nothing about each other, and the asker's event is the one answered."""
    from workers.answering.web.history import _when

    answered = ("1700000000000-0", {"event": "answered", "_source": "audit"})
    asked = ("1700000000000-0", {"event": "asked", "_source": "asker"})
    withdrew = ("1700000000000-1", {"event": "withdrawn", "_source": "asker"})
    later = ("1700000000001-0", {"event": "expired", "_source": "audit"})
    ordered = sorted([later, answered, withdrew, asked], key=_when)
    assert [fields["event"] for _, fields in ordered] == ["asked", "withdrawn", "answered", "expired"]


def test_every_text_a_page_shows_is_inert_and_a_label_keeps_its_bytes_to_answer_with() -> None:
    """Control characters and bidi overrides reach a page as escapes (workers.inert): plain fields, the
    markdown detail, the plan's buttons, the arguments; ``label`` stays the value an answer sends."""
    from broker import AskUserQuestionRequest, Editable
    from workers.answering.web.render import readonly_view
    from workers.inert import steers

    evil = "\x1b[2J\x1bM\u202e"
    question = AskUserQuestionItem(
        id="q1",
        question="Q" + evil,
        header="H" + evil,
        detail="**D**" + evil,
        options=(
            AskUserQuestionOption(label="Approve" + evil, description="d" + evil),
            AskUserQuestionOption(label="No"),
        ),
        intent=PlanReviewIntent(approve="Approve" + evil),
        editable=Editable(arguments={"cmd": "rm" + evil}, approve="Approve" + evil),
    )
    pending = _Pending(AskUserQuestionRequest(questions=(question,), agent="agent" + evil))
    view = request_view(pending)  # type: ignore[arg-type]
    [shown] = view["questions"]
    assert shown["options"][0]["label"] == "Approve" + evil and shown["planReview"]["approve"] == "Approve" + evil
    values = {"label", "approve", "arguments"}  # the bytes an answer sends back, never shown as they are
    leaks = [text for text in _strings(view, values) if steers(text)]
    assert leaks == []
    assert shown["question"] == "Q\\x1b[2J\\x1bM\\u202e" and "D</strong>\\x1b[2J" in shown["detailHtml"]
    assert shown["options"][0]["text"] == "Approve\\x1b[2J\\x1bM\\u202e"
    assert shown["editable"]["argumentsText"] == '{\n  "cmd": "rm\\u001b[2J\\u001bM\\u202e"\n}'
    assert view["agent"] == "agent\\x1b[2J\\x1bM\\u202e"
    listed = readonly_view("r1", pending.request, 0)
    assert [text for text in _strings(listed, set()) if steers(text)] == []


class _Pending:
    """What ``request_view`` reads of a ``PendingRequest``."""

    def __init__(self, request: Any) -> None:
        from broker import Asker

        self.request, self.request_id, self.agent_id, self.priority = request, "r1", request.agent, "normal"
        self.created_ms, self.asker_away, self.rememberable = 0, False, True
        self.askers = (Asker(agent_id=request.agent, request_id="r1", verified=False),)


def _strings(value: Any, skip: set[str]) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() if key not in skip for text in _strings(item, skip)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item, skip)]
    return []


def test_a_settled_answer_pages_are_told_of_shows_its_labels_inert() -> None:
    """A late click's note and a removed card's note say what was answered: a label an asker wrote, made inert."""
    from workers.answering.web.settled import Settled

    answer: dict[str, Any] = {"answers": [{"id": "q1", "selected": ["yes\u202eon"], "custom": None}, {"id": "q2", "selected": [],
              "custom": "x\x1b[2J"}]}  # fmt: skip
    shown = Settled("answered", "bob", answer).view()["answer"]["answers"]
    assert [(item["selected"], item["custom"]) for item in shown] == [(["yes\\u202eon"], None), ([], "x\\x1b[2J")]
    assert answer["answers"][0]["selected"] == ["yes\u202eon"]  # what was kept is not changed
