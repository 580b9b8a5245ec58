"""``ask_user_question`` for any framework that turns a typed async function into a tool.

The arguments are the seeds' request as pydantic models (so the framework derives the
JSON Schema the model sees), intent and detail included: a plan review reaches the human
as a plan card, not a plain question. The result is the answer JSON, or
``{name, code, message}`` so the model can decide what to do next. Needs pydantic (every
supported framework brings it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec
from pydantic import BaseModel, Field

from broker import UserQuestionError
from broker.errors import BAD_REQUEST
from broker.types import convert_request, encode

from ._approvals import Asker

__all__ = ["Option", "PlanReview", "Question", "ask_user_question_function"]

DESCRIPTION = (
    "Ask the human one or more questions and wait for the answer. Use options for choices (the "
    "label is what you get back); multiSelect to allow several; detail for supporting markdown. "
    "For a plan review put the plan's markdown in detail and set intent "
    '{"kind": "plan-review", "approve": "<label of the approving option>"}. Returns '
    '{"answers": [{"id", "selected": [labels], "custom"?: free text}]} (empty selected and no '
    "custom: skipped), or {name, code, message}: ASK_CANCELLED (the human dismissed it), "
    "ASK_TIMED_OUT (nobody answered in time), NO_PROVIDER (nobody is there to ask), BAD_REQUEST / "
    "BAD_INTENT (fix the request), DELEGATED_CALLER (put the question in your result instead)."
)


class Option(BaseModel):
    label: str = Field(description="what the human sees and what you get back")
    description: str | None = None


class PlanReview(BaseModel):
    """Present the question as a plan review: ``detail`` holds the plan."""

    kind: Literal["plan-review"]
    approve: str = Field(description="the label of the option that approves; every other option declines")


class Question(BaseModel):
    id: str = Field(description="your id for this question, echoed in the answer")
    question: str
    detail: str | None = Field(default=None, description="markdown shown with the question (the plan, for a review)")
    header: str | None = Field(default=None, description="a short group label")
    options: list[Option] | None = Field(default=None, description="none: a free-text question")
    multiSelect: bool = False  # the seeds' wire name, as the model sees it
    intent: PlanReview | None = None


def ask_user_question_function(
    asker: Asker, *, timeout: float | None = 900.0
) -> Callable[[list[Question]], Awaitable[str]]:
    """The tool function; ``asker`` is a live ``broker.Agent`` (or a ``Broker``)."""

    async def ask_user_question(questions: list[Question]) -> str:
        try:
            try:
                request = convert_request({"questions": [q.model_dump(exclude_none=True) for q in questions]})
            except msgspec.ValidationError as error:
                raise UserQuestionError(f"the request is not valid: {error}", BAD_REQUEST) from error
            return encode(await asker.ask(request, timeout=timeout)).decode()
        except UserQuestionError as error:
            return json.dumps(error.to_dict())

    ask_user_question.__doc__ = DESCRIPTION
    return ask_user_question
