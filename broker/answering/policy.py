"""One approval policy: which cards it covers, and what a covered card needs (quorum.py counts the votes).

A policy matches by agent, header, intent, priority or question text; every matcher given must
match. It names how many approvals a covered card needs, from whom (``groups``), whether one
decline decides, who sees the card (``route``) and who may answer it too once it waited
(``escalate``).
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ..decisions import Decision
from ..types import AskUserQuestionRequest, PlanReviewIntent
from .cards import PendingRequest

__all__ = ["DeclineRule", "Policy", "PolicyError"]

DeclineRule = Literal["any", "quorum"]


class PolicyError(ValueError):
    """The policy file or the groups table is malformed."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One ``[[policy]]``: what it matches, and what a matching card needs."""

    name: str
    approvals: int = 1
    groups: tuple[str, ...] = ()
    """the voters must belong to one of these groups (empty: anyone who may answer)"""
    decline: DeclineRule = "any"
    route: str = ""
    """a group: only its members see and answer the card on the page"""
    approve: tuple[str, ...] = ()
    """option labels that approve, for questions without a plan-review intent"""
    escalate_after: float = 0.0
    """seconds after a card was asked when ``escalate_to`` may answer it too"""
    escalate_to: str = ""
    """a group that, once the card waited ``escalate_after``, may see, answer and vote on it too"""
    agent: tuple[str, ...] = ()
    header: tuple[str, ...] = ()
    intent: tuple[str, ...] = ()
    priority: tuple[str, ...] = ()
    text: str = ""
    """a regular expression searched (case-insensitively) in each question's text"""

    def covers(self, request: AskUserQuestionRequest, priority: str, agents: Iterable[str | None]) -> bool:
        """Whether a card (its request, priority and every asker's agent id) matches: every matcher given
        must match, and the question matchers must match one question of the batch."""
        if self.priority and priority not in self.priority:
            return False
        if self.agent and not any(_glob(agent or "", self.agent) for agent in agents):
            return False
        return any(
            (not self.header or _glob(item.header or "", self.header))
            and (not self.intent or _intent_kind(item.intent) in self.intent)
            and (not self.text or re.search(self.text, item.question, re.IGNORECASE) is not None)
            for item in request.questions
        )

    def escalated(self, pending: PendingRequest, now: float | None = None) -> bool:
        """Whether the card waited long enough for the escalation group to answer it too."""
        return self.escalated_since(pending.created_ms, now)

    def escalated_since(self, created_ms: int, now: float | None = None) -> bool:
        """Whether a card asked at ``created_ms`` (unix ms) waited long enough for the escalation group."""
        if not self.escalate_to:
            return False
        now_ms = (time.time() if now is None else now) * 1000
        return now_ms >= created_ms + self.escalate_after * 1000

    def escalates_in(self, pending: PendingRequest) -> float | None:
        """Seconds until the card escalates (``None``: it never does, or already did)."""
        if not self.escalate_to or self.escalated(pending):
            return None
        return max(0.0, (pending.created_ms + self.escalate_after * 1000) / 1000 - time.time())

    def may_cover(self, decision: Decision) -> bool:
        """Whether a remembered decision could answer a question this policy covers (priority and, for a
        namespace-wide decision, the asking agent are not known in advance: they may match)."""
        if self.intent:
            return False  # no decision answers an intent question
        if self.agent and decision.agent is not None and not _glob(decision.agent, self.agent):
            return False
        if self.header and not _glob(decision.header or "", self.header):
            return False
        return not self.text or re.search(self.text, decision.question, re.IGNORECASE) is not None


def _glob(value: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def _intent_kind(intent: Any) -> str:
    if intent is None:
        return ""
    if isinstance(intent, PlanReviewIntent):
        return "plan-review"
    return str(getattr(intent, "kind", "unknown"))
