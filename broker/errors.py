"""The error taxonomy: every failure carries a stable ``code`` to route on."""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = [
    "ASK_ABORTED",
    "ASK_CANCELLED",
    "ASK_TIMED_OUT",
    "BAD_ANSWER",
    "BAD_INTENT",
    "BAD_REQUEST",
    "CALLER_NOT_LIVE",
    "DELEGATED_CALLER",
    "DUPLICATE_PROVIDER",
    "EMPTY_QUESTIONS",
    "ERROR_CODES",
    "LEASE_LOST",
    "NOT_APPROVER",
    "NOT_PENDING",
    "NO_PROVIDER",
    "NO_SIGNING_KEY",
    "NO_TRUSTED_KEY",
    "NO_TOKENS",
    "PORT_IN_USE",
    "UNAUTHENTICATED",
    "UNKNOWN_ASK",
    "BROKER_UNAVAILABLE",
    "HarnessError",
    "UserQuestionError",
    "ErrorPayload",
]

# From the seeds.
ASK_ABORTED: Final = "ASK_ABORTED"
EMPTY_QUESTIONS: Final = "EMPTY_QUESTIONS"
CALLER_NOT_LIVE: Final = "CALLER_NOT_LIVE"
DELEGATED_CALLER: Final = "DELEGATED_CALLER"
BAD_INTENT: Final = "BAD_INTENT"
NO_PROVIDER: Final = "NO_PROVIDER"
DUPLICATE_PROVIDER: Final = "DUPLICATE_PROVIDER"
ASK_CANCELLED: Final = "ASK_CANCELLED"
# Ours: what a distributed router needs on top.
ASK_TIMED_OUT: Final = "ASK_TIMED_OUT"
BAD_REQUEST: Final = "BAD_REQUEST"
BAD_ANSWER: Final = "BAD_ANSWER"
NOT_PENDING: Final = "NOT_PENDING"
LEASE_LOST: Final = "LEASE_LOST"
BROKER_UNAVAILABLE: Final = "BROKER_UNAVAILABLE"
NO_TRUSTED_KEY: Final = "NO_TRUSTED_KEY"
"""an asker with no public key to check answers against (no silent unsigned mode)"""
NO_SIGNING_KEY: Final = "NO_SIGNING_KEY"
"""a provider with no key to sign its answers with"""
UNAUTHENTICATED: Final = "UNAUTHENTICATED"
"""a gateway (or MCP over HTTP) caller without a valid bearer token; never says whether the agent exists"""
UNKNOWN_ASK: Final = "UNKNOWN_ASK"
"""no ask of the calling agent has that id at the gateway (another agent's ask is unknown too)"""
NO_TOKENS: Final = "NO_TOKENS"
"""an HTTP listener beyond loopback with no bearer tokens to check callers against"""
NOT_APPROVER: Final = "NOT_APPROVER"
"""a quorum policy covers the request and this person is not one of its approvers (broker/answering/quorum.py)"""
PORT_IN_USE: Final = "PORT_IN_USE"
"""``qbroker quickstart``: a port it would listen on is taken (another process, a stack left running)"""

ERROR_CODES: Final = frozenset(
    {
        ASK_ABORTED,
        EMPTY_QUESTIONS,
        CALLER_NOT_LIVE,
        DELEGATED_CALLER,
        BAD_INTENT,
        NO_PROVIDER,
        DUPLICATE_PROVIDER,
        ASK_CANCELLED,
        ASK_TIMED_OUT,
        BAD_REQUEST,
        BAD_ANSWER,
        NOT_PENDING,
        LEASE_LOST,
        BROKER_UNAVAILABLE,
        NO_TRUSTED_KEY,
        NO_SIGNING_KEY,
        UNAUTHENTICATED,
        UNKNOWN_ASK,
        NO_TOKENS,
        NOT_APPROVER,
        PORT_IN_USE,
    }
)


class ErrorPayload(msgspec.Struct, frozen=True, kw_only=True):
    """The wire form of an error: ``{name, code, message}``."""

    name: str
    code: str
    message: str


class HarnessError(Exception):
    """Base of the framework's errors: a message plus a stable, machine-readable code."""

    name: str = "HarnessError"

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "code": self.code, "message": self.message}

    def to_payload(self) -> ErrorPayload:
        return ErrorPayload(name=self.name, code=self.code, message=self.message)


class UserQuestionError(HarnessError):
    """A user-questions failure (see ``ERROR_CODES``)."""

    name = "UserQuestionError"

    @classmethod
    def from_payload(cls, payload: ErrorPayload) -> UserQuestionError:
        """Restore an error that crossed the wire, keeping the original as its cause."""
        error = cls(payload.message, payload.code)
        error.__cause__ = _RemoteError(payload)
        return error


class _RemoteError(Exception):
    """The error as it was raised on the far side, kept as the restored error's cause."""

    def __init__(self, payload: ErrorPayload) -> None:
        super().__init__(f"{payload.name} {payload.code}: {payload.message}")
        self.payload = payload
