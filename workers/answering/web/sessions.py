"""Server-side sessions: one Redis key per signed-in browser, revocable and expiring.

The cookie holds only a random id (256 bits). Redis keeps the session under the digest
of that id (``qb:{ns}:web:session:<digest>``), as one JSON string with a PX TTL, and
lists the digests in a sorted set (``qb:{ns}:web:sessions``, no SCAN needed), so a
session ends when it expires, when its person signs out, when an operator revokes it
(``qbroker web sessions revoke``) or when the users file no longer says what it said of its
person at sign-in (``SessionRecord.grant``); and reading Redis (or the listing) gives nobody a
usable cookie.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from workers.answering.web.keys import WebKeys, digest

__all__ = ["SHORT_ID", "SessionInfo", "SessionRecord", "SessionStore"]

SHORT_ID = 12
"""characters of the key digest shown as a session's id"""

Call = Callable[..., Awaitable[Any]]


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    user: str
    csrf: str
    created_ms: int
    address: str = ""
    agent: str = ""
    """the browser's User-Agent, cut short (to recognise a session in the listing)"""
    grant: str = ""
    """what the users file said of ``user`` at sign-in (``Credentials.grant``): once it says otherwise,
    the session ends. A session made before grants existed has none, and ends at its next request."""


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A session as the operator sees it: no cookie, no CSRF token."""

    id: str
    user: str
    created_ms: int
    expires_in_s: float
    address: str
    agent: str


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SessionRecord)


class SessionStore:
    def __init__(self, call: Call, keys: WebKeys, *, max_age: float, clock: Callable[[], float] = time.time) -> None:
        self._call, self._keys, self._max_age_ms, self._clock = call, keys, int(max_age * 1000), clock

    async def create(
        self, user: str, *, grant: str = "", address: str = "", agent: str = ""
    ) -> tuple[str, SessionRecord]:
        """A new session for ``user``: the cookie value and the record."""
        cookie = secrets.token_urlsafe(32)
        record = SessionRecord(
            user=user,
            csrf=secrets.token_urlsafe(24),
            created_ms=int(self._clock() * 1000),
            address=address[:100],
            agent=agent[:120],
            grant=grant,
        )
        session_digest = digest(cookie)
        await self._call("SET", self._keys.session(session_digest), _encoder.encode(record), "PX", self._max_age_ms)
        # The index lets `sessions list` work without SCAN (which a namespace's ACL refuses).
        # Its scores are for pruning only; the records' own TTLs decide when a session ends.
        await self._call("ZADD", self._keys.sessions, record.created_ms + self._max_age_ms, session_digest)
        await self._call("ZREMRANGEBYSCORE", self._keys.sessions, "-inf", record.created_ms)
        await self._call("PEXPIRE", self._keys.sessions, self._max_age_ms, "GT")
        await self._call("PEXPIRE", self._keys.sessions, self._max_age_ms, "NX")
        return cookie, record

    async def get(self, cookie: str) -> SessionRecord | None:
        if not cookie or len(cookie) > 200:
            return None
        raw = await self._call("GET", self._keys.session(digest(cookie)))
        if raw is None:
            return None
        try:
            return _decoder.decode(raw)
        except msgspec.DecodeError:
            return None

    async def end(self, cookie: str) -> None:
        """Sign-out: the cookie stops working at once, here and on every other server."""
        session_digest = digest(cookie)
        await self._call("DEL", self._keys.session(session_digest))
        await self._call("ZREM", self._keys.sessions, session_digest)

    async def list(self) -> list[SessionInfo]:
        found: list[SessionInfo] = []
        for session_digest in await self._call("ZRANGE", self._keys.sessions, 0, -1):
            key = self._keys.session(session_digest)
            raw, pttl = await self._call("GET", key), await self._call("PTTL", key)
            if raw is None:  # expired or revoked: drop it from the index too
                await self._call("ZREM", self._keys.sessions, session_digest)
                continue
            try:
                record = _decoder.decode(raw)
            except msgspec.DecodeError:
                continue
            found.append(
                SessionInfo(
                    id=session_digest[:SHORT_ID],
                    user=record.user,
                    created_ms=record.created_ms,
                    expires_in_s=max(0, int(pttl)) / 1000,
                    address=record.address,
                    agent=record.agent,
                )
            )
        return sorted(found, key=lambda info: (info.user, info.created_ms))

    async def revoke(self, *, ids: tuple[str, ...] = (), user: str | None = None, everyone: bool = False) -> int:
        """End the sessions named by id (a prefix of at least 6 characters), of a user, or all; returns how many."""
        wanted = {
            s.id
            for s in await self.list()
            if everyone or s.user == user or any(len(i) >= 6 and s.id.startswith(i) for i in ids)
        }
        ended = 0
        for session_digest in await self._call("ZRANGE", self._keys.sessions, 0, -1):
            if session_digest[:SHORT_ID] in wanted:
                ended += int(await self._call("DEL", self._keys.session(session_digest)))
                await self._call("ZREM", self._keys.sessions, session_digest)
        return ended
