"""Request builders shared by the tests."""

from __future__ import annotations

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    PlanReviewIntent,
)


def options(*labels: str) -> tuple[AskUserQuestionOption, ...]:
    return tuple(AskUserQuestionOption(label=label) for label in labels)


def question(qid: str = "q1", *labels: str, multi: bool = False, **fields: object) -> AskUserQuestionItem:
    return AskUserQuestionItem(
        id=qid, question=f"question {qid}?", options=options(*labels) if labels else None, multi_select=multi, **fields
    )  # type: ignore[arg-type]


def one_question(*labels: str, agent: str | None = None) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(questions=(question("q1", *(labels or ("yes", "no"))),), agent=agent)


def plan_review(approve: str = "Approve", *labels: str) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(
        questions=(
            question(
                "plan",
                *(labels or ("Approve", "Refuse")),
                detail="# Plan\n1. do it",
                intent=PlanReviewIntent(approve=approve),
            ),
        )
    )


def answer(*items: tuple[str, tuple[str, ...], str | None]) -> AskUserQuestionAnswer:
    return AskUserQuestionAnswer(
        answers=tuple(AskUserQuestionAnswerItem(id=i, selected=s, custom=c) for i, s, c in items)
    )


def pick(label: str, qid: str = "q1") -> AskUserQuestionAnswer:
    return answer((qid, (label,), None))
