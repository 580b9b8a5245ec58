"""One ask the gateway runs for an agent: its state, its reply, and the HTTP status of its error."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, UserQuestionError
from broker.errors import BAD_REQUEST

__all__ = ["HTTP_STATUS", "GatewayAsk", "checked_attachments"]

HTTP_STATUS: Final[Mapping[str, int]] = {
    "BAD_REQUEST": 400,
    "EMPTY_QUESTIONS": 400,
    "BAD_INTENT": 400,
    "BAD_ANSWER": 400,
    "UNAUTHENTICATED": 401,
    "DELEGATED_CALLER": 403,
    "UNKNOWN_ASK": 404,
    "CALLER_NOT_LIVE": 409,
    "ASK_CANCELLED": 409,
    "ASK_ABORTED": 409,
    "NOT_PENDING": 409,
    "LEASE_LOST": 409,
    "DUPLICATE_PROVIDER": 409,
    "NO_PROVIDER": 503,
    "BROKER_UNAVAILABLE": 503,
    "ASK_TIMED_OUT": 504,
    "NO_TRUSTED_KEY": 500,
    "NO_SIGNING_KEY": 500,
    "NO_TOKENS": 500,
}
"""the HTTP status of a reply carrying each error code (500 for any other)"""


def checked_attachments(request: AskUserQuestionRequest, given: Any) -> tuple[str, ...]:
    """The texts to keep for ``request``: each one a question names (SHA-256 and size), and no other."""
    if not isinstance(given, list) or not all(isinstance(text, str) for text in given):
        raise UserQuestionError("attachments must be a list of texts", BAD_REQUEST)
    named = {(item.attachment.sha256, item.attachment.size) for item in request.questions if item.attachment}
    for text in given:
        raw = text.encode()
        if (hashlib.sha256(raw).hexdigest(), len(raw)) not in named:
            # An attachment is kept only for a question that shows it: the gateway is no store of its own.
            raise UserQuestionError("an attachment no question of the request names (by SHA-256 and size)", BAD_REQUEST)
    return tuple(given)


def _iso(seconds: float) -> str:
    """``seconds`` (Unix time) as ISO 8601 UTC, to the second."""
    return _iso_second(int(seconds))


@functools.lru_cache(maxsize=4)
def _iso_second(second: int) -> str:
    # Asks made in the same second share the text: strftime was a fiftieth of the gateway's CPU on an ask.
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


@dataclass(eq=False)
class GatewayAsk:
    """One ask the gateway runs for an agent."""

    id: str
    agent_id: str
    key: str | None
    digest: str
    """SHA-256 of the request JSON: a keyed re-attach must ask the very same thing ('' unkeyed)"""
    questions: tuple[str, ...]
    created: float = field(default_factory=time.time)
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    answer: AskUserQuestionAnswer | None = None
    error: UserQuestionError | None = None
    task: asyncio.Task[None] | None = None
    watchers: int = 0
    seen: float = 0.0
    """loop time a caller last asked or waited for it"""
    ended: float = 0.0
    collected: bool = False
    """a reply has carried its answer to a caller: its key no longer re-attaches to it"""

    @property
    def state(self) -> str:
        if not self.done.is_set():
            return "pending"
        return "answered" if self.answer is not None else "failed"

    def view(self) -> dict[str, Any]:
        """What a reply says of it; a reply that carries the answer collects it."""
        shown: dict[str, Any] = {
            "id": self.id,
            "agent": self.agent_id,
            "state": self.state,
            "createdAt": _iso(self.created),
            "questions": list(self.questions),
        }
        if self.key is not None:
            shown["key"] = self.key
        if self.answer is not None:
            shown["answer"] = self.answer  # a Struct: the response's encoder writes it in its wire form
            self.collected = True
        if self.error is not None:
            shown["error"] = self.error.to_dict()
        return shown

    @property
    def status(self) -> int:
        if self.error is not None:
            return HTTP_STATUS.get(self.error.code, 500)
        return 200 if self.answer is not None else 202
