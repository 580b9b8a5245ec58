"""The question the benchmarks ask: one yes-or-no item (id ``q1``), and the answer that picks yes."""

from __future__ import annotations

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
)

OPTIONS = (AskUserQuestionOption(label="yes"), AskUserQuestionOption(label="no"))
YES = AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id="q1", selected=("yes",)),))
"""the answer to a yes_or_no() request"""


def yes_or_no(text: str, *, priority: str = "normal") -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id="q1", question=text, options=OPTIONS)
    return AskUserQuestionRequest(questions=(item,), priority=priority)
