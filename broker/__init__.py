"""question-broker: a distributed, Redis-backed broker for AI agents' questions to humans."""

from __future__ import annotations

from .answering.provider import HANDOVER_GRACE, Asker, Handover, PendingRequest, Provider
from .answering.quorum import Policies, Policy, PolicyError, Tally, load_policies
from .asking.agents import Agent
from .broker import Answerer, Broker, Next
from .decisions import Decision, Remember, question_fingerprint
from .errors import ERROR_CODES, HarnessError, UserQuestionError
from .operating.reads import QueuedAsk, Reads, Settlement
from .operating.status import NamespaceStatus, namespace_status
from .signing import SigningKey, TrustedKeys
from .types import (
    PRIORITIES,
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionIntent,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Attachment,
    Editable,
    PlanReviewIntent,
    UnknownIntent,
)
from .validation import Limits, check_answer, check_request

__all__ = [
    "ERROR_CODES",
    "HANDOVER_GRACE",
    "Agent",
    "Answerer",
    "Asker",
    "Handover",
    "AskUserQuestionAnswer",
    "AskUserQuestionAnswerItem",
    "AskUserQuestionIntent",
    "AskUserQuestionItem",
    "AskUserQuestionOption",
    "AskUserQuestionRequest",
    "Attachment",
    "Broker",
    "Decision",
    "Editable",
    "HarnessError",
    "Limits",
    "NamespaceStatus",
    "Next",
    "PRIORITIES",
    "PendingRequest",
    "PlanReviewIntent",
    "Policies",
    "Policy",
    "PolicyError",
    "Provider",
    "QueuedAsk",
    "Reads",
    "Remember",
    "Settlement",
    "SigningKey",
    "Tally",
    "TrustedKeys",
    "UnknownIntent",
    "UserQuestionError",
    "check_answer",
    "check_request",
    "load_policies",
    "namespace_status",
    "question_fingerprint",
]
