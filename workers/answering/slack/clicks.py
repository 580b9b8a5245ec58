"""What a click on a card's buttons means: the options ticked, and the answer a button gives."""

from __future__ import annotations

from typing import Any

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, PendingRequest
from workers.answering.web.render import plan_review

__all__ = ["answer_of", "ticked"]


def ticked(payload: dict[str, Any], pending: PendingRequest) -> dict[str, list[str]]:
    """The options ticked on the card (``state.values``), as labels by question index."""
    values = (payload.get("state") or {}).get("values") or {}
    picked: dict[str, list[str]] = {}
    for index, item in enumerate(pending.request.questions):
        element = (values.get(f"qbq_{index}") or {}).get("qb_sel") or {}
        options = element.get("selected_options") or (
            [element["selected_option"]] if element.get("selected_option") else []
        )
        labels = item.labels
        chosen = [
            labels[int(o["value"])]
            for o in options
            if str(o.get("value", "")).isdigit() and int(o["value"]) < len(labels)
        ]
        picked[str(index)] = chosen
    return picked


def answer_of(
    action_id: str, ref: dict[str, Any], payload: dict[str, Any], pending: PendingRequest | None
) -> AskUserQuestionAnswer | None:
    """What a button says, as an answer (``None`` when the card is no longer here)."""
    if pending is None:
        return None
    questions = pending.request.questions
    if action_id == "qb_approve":
        review = plan_review(questions[0], len(questions))
        if review is None:
            return None
        return AskUserQuestionAnswer(
            answers=(AskUserQuestionAnswerItem(id=questions[0].id, selected=(review["approve"],)),)
        )
    if action_id.startswith("qb_pick_"):
        labels = questions[0].labels
        index = int(ref.get("o", -1))
        if not 0 <= index < len(labels):
            return None
        return AskUserQuestionAnswer(
            answers=(AskUserQuestionAnswerItem(id=questions[0].id, selected=(labels[index],)),)
        )
    if action_id == "qb_submit":
        picked = ticked(payload, pending)
        return AskUserQuestionAnswer(
            answers=tuple(
                AskUserQuestionAnswerItem(id=item.id, selected=tuple(picked[str(i)]))
                for i, item in enumerate(questions)
            )
        )
    return None
