"""The benchmarks' question: one yes/no question, and the answer that says yes."""

from __future__ import annotations

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
)

__all__ = ["yes", "yes_no"]

_OPTIONS = (AskUserQuestionOption(label="yes"), AskUserQuestionOption(label="no"))


def yes_no(text: str, *, question_id: str = "q1", priority: str = "normal") -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id=question_id, question=text, options=_OPTIONS)
    return AskUserQuestionRequest(questions=(item,), priority=priority)


def yes(question_id: str = "q1") -> AskUserQuestionAnswer:
    return AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id=question_id, selected=("yes",)),))
