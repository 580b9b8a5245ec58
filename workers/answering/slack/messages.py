"""Where each card's Slack message is: kept in Redis, so the server that holds the lease next updates
that message (a vote, a settlement) rather than posting the card again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from workers.answering.web.keys import WebKeys

__all__ = ["MESSAGE_TTL_MS", "SlackMessages"]

MESSAGE_TTL_MS = 7 * 24 * 3600 * 1000
"""how long a card's Slack message is remembered, so a late settlement still updates it"""


class SlackMessages:
    """The Slack messages of one namespace's cards, by request id (``WebKeys.slack_message``)."""

    def __init__(self, call: Callable[..., Awaitable[Any]], keys: WebKeys) -> None:
        self._call, self._keys = call, keys

    async def find(self, request_id: str) -> tuple[str, str] | None:
        """``(channel, ts)`` of the card's message, when one was posted (by any server) and is remembered."""
        channel, ts = await self._call("HMGET", self._keys.slack_message(request_id), "channel", "ts")
        return (str(channel), str(ts)) if channel and ts else None

    async def keep(self, request_id: str, channel: str, ts: str) -> None:
        key = self._keys.slack_message(request_id)
        await self._call("HSET", key, "channel", channel, "ts", ts)
        await self._call("PEXPIRE", key, MESSAGE_TTL_MS)
