"""What the page is sent: sanitised markdown and the plan-review card's conditions."""

from __future__ import annotations

import pytest

from broker import AskUserQuestionItem, AskUserQuestionOption, PlanReviewIntent, UnknownIntent
from workers.answering.web.render import plan_review, render_markdown


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
    assert plan_review(item("Refuse", "Approve"), 1) == {"approve": "Approve", "refuse": "Refuse"}
    assert plan_review(item("Approve"), 1) == {"approve": "Approve", "refuse": None}


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
