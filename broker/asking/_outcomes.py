"""What an ask gets: a settled future's outcome, and the answer an outcome holds."""

from __future__ import annotations

import asyncio

from ..errors import BROKER_UNAVAILABLE, UserQuestionError
from ..types import AskUserQuestionAnswer, Outcome, answered, decode_outcome

__all__ = ["answer_of", "outcome_of"]


def outcome_of(future: asyncio.Future[str]) -> str | None:
    """``future``'s outcome, if it has one (None: not done, cancelled or failed)."""
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return None


def answer_of(outcome: str, verified: Outcome | None = None) -> AskUserQuestionAnswer:
    """The answer an outcome holds, or its error raised (``verified``: ``outcome`` as ``accepts`` decoded and
    verified it; only then does the answer name who answered, as its seal says)."""
    decoded = verified if verified is not None else decode_outcome(outcome)
    if decoded.error is not None:
        raise UserQuestionError.from_payload(decoded.error)
    if decoded.answer is None:
        raise UserQuestionError("the outcome holds neither an answer nor an error", BROKER_UNAVAILABLE)
    if verified is None or verified.proof is None:
        return decoded.answer
    return answered(decoded.answer, verified.proof.by)
