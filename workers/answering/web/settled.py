"""How a card that is no longer pending was settled: what pages are told of it, and a late answer's refusal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker import Broker, Reads, UserQuestionError
from workers.answering.web.errors import REDIS_DOWN
from workers.answering.web.history import find_settlement, outcome_json
from workers.inert import inert

__all__ = ["NOT_PENDING", "AlreadySettled", "Settled", "settled_in_redis"]

NOT_PENDING = "NOT_PENDING"


@dataclass(frozen=True)
class Settled:
    state: str
    by: str
    answer: Any = None
    """the accepted answer as JSON-ready data, when it was answered"""
    routes: list[str] | None = None
    """the groups it was routed to, as the audit recorded them (``None``: not known)"""

    def view(self) -> dict[str, Any]:
        """What pages are told of it: the answer's labels and text as a page shows them (``workers.inert``)."""
        return {"state": self.state, "by": self.by, "answer": _shown_answer(self.answer)}


def _shown_answer(answer: Any) -> Any:
    if not isinstance(answer, dict) or not isinstance(answer.get("answers"), list):
        return answer
    items = []
    for item in answer["answers"]:
        if isinstance(item, dict):
            item = dict(item)
            if isinstance(item.get("selected"), list):
                item["selected"] = [inert(label) if isinstance(label, str) else label for label in item["selected"]]
            if isinstance(item.get("custom"), str):
                item["custom"] = inert(item["custom"])
        items.append(item)
    return {**answer, "answers": items}


class AlreadySettled(UserQuestionError):
    """``NOT_PENDING`` that says who was first and what they answered (``winner``)."""

    def __init__(self, message: str, winner: dict[str, Any] | None) -> None:
        super().__init__(message, NOT_PENDING)
        self.winner = winner


async def settled_in_redis(broker: Broker, request_id: str) -> Settled | None:
    """How a request this server does not remember was settled (by another server, say)."""
    try:
        found = await Reads(broker).settlement(request_id)
        state, by, outcome = found.state, found.by, found.outcome
        if not state or (state != "pending" and not outcome):
            # The asker has read its outcome: the hash is gone or a slim tombstone, and the
            # outcome key too. The audit stream holds what was answered and by whom.
            settlement = await find_settlement(broker, request_id)
            if settlement is not None:
                return Settled(*settlement)
            if not state:
                return None
    except (*REDIS_DOWN, UserQuestionError):
        return None
    if state == "pending":
        return None
    return Settled(str(state), str(by or ""), outcome_json(outcome).get("answer"))
