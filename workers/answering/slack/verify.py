"""Slack's signed requests: checked before anything in them is read (docs/slack.md).

Slack signs every interactive request (a button, a modal's submission) with the app's signing
secret: ``X-Slack-Signature: v0=<HMAC-SHA256 of "v0:<timestamp>:<body>">`` and
``X-Slack-Request-Timestamp``. The HMAC and the timestamp window are the official
``slack_sdk.signature.SignatureVerifier``'s; on top, a request seen once is refused again: its
signature is kept in Redis (``SET NX``) for as long as any server of the namespace may still take
its timestamp (twice the window, and ``CLOCK_SKEW_S``), so a captured click replayed within the
window (or to another web server of the namespace) does nothing.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from slack_sdk.signature import Clock, SignatureVerifier

from workers.answering.web.keys import WebKeys

__all__ = ["CLOCK_SKEW_S", "WINDOW_S", "SlackRefused", "SlackVerifier"]

WINDOW_S = 300
"""how far a request's timestamp may be from now, seconds (Slack's own advice: five minutes)"""
CLOCK_SKEW_S = 60
"""how far apart the clocks of a namespace's web servers may be, seconds, and a replay still be refused"""


class SlackRefused(Exception):
    """A request that is not Slack's, or not fresh: answered 401 and never read further."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Clock(Clock):
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class SlackVerifier:
    """Checks one namespace's Slack requests: signature, timestamp window, first use."""

    def __init__(
        self,
        signing_secret: str,
        call: Callable[..., Awaitable[Any]],
        keys: WebKeys,
        *,
        now: Callable[[], float] = time.time,
        window_s: int = WINDOW_S,
    ) -> None:
        self._verifier = SignatureVerifier(signing_secret, clock=_Clock(now))
        self._call = call
        self._keys = keys
        self._now = now
        self._window_s = window_s

    def __repr__(self) -> str:
        return f"SlackVerifier(namespace={self._keys.namespace!r})"  # never the secret

    async def check(self, body: bytes, headers: Mapping[str, str]) -> None:
        """Return if the request is Slack's, fresh and new; else raise ``SlackRefused``."""
        lower = {name.lower(): value for name, value in headers.items()}
        timestamp, signature = lower.get("x-slack-request-timestamp"), lower.get("x-slack-signature")
        if not timestamp or not signature:
            raise SlackRefused("unsigned: X-Slack-Signature and X-Slack-Request-Timestamp are required")
        try:
            sent = int(timestamp)
        except ValueError:
            raise SlackRefused("malformed X-Slack-Request-Timestamp") from None
        if abs(self._now() - sent) > self._window_s:
            raise SlackRefused(f"stale: the timestamp is more than {self._window_s}s from now")
        if not self._verifier.is_valid(body, timestamp, signature):
            raise SlackRefused("bad signature")
        seen = self._keys.slack_seen(signature)
        # Taken as early as a window before its timestamp, a click stays fresh until a window after it, by the
        # clock of whichever server it is replayed to: a record of exactly twice the window let a replay through
        # to a server whose clock lags, or one whose SET landed a moment after its own check.
        lifetime_ms = (2 * self._window_s + CLOCK_SKEW_S) * 1000
        if not await self._call("SET", seen, "1", "NX", "PX", lifetime_ms):
            raise SlackRefused("replayed: this signed request was already taken")
