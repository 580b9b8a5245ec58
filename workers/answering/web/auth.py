"""Who is asking: bearer tokens for scripts, server-side sessions for people; CSRF checks.

A session cookie holds only a random session id (HttpOnly, SameSite=Strict); the
session itself (user, CSRF token) lives in Redis (see ``sessions``). Every
state-changing request made with the cookie must echo the session's CSRF token in
``X-CSRF-Token`` (the page reads it from ``GET /api/session``); requests with a bearer
token carry no ambient credential and need no CSRF token. Failed sign-ins and token
guesses are throttled (see ``throttle``).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from workers.answering.web.config import WebConfig
from workers.answering.web.errors import WebError, unauthenticated
from workers.answering.web.sessions import SessionRecord, SessionStore
from workers.answering.web.throttle import Throttle, client_address

__all__ = ["COOKIE", "Auth", "Identity", "check_same_origin"]

COOKIE = "qb_session"
CSRF_HEADER = "x-csrf-token"
_MAX_NAME = 200


@dataclass(frozen=True)
class Identity:
    user: str
    csrf: str | None
    """the session's CSRF token; ``None`` for a bearer token"""
    namespaces: tuple[str, ...] = ()
    """the served namespaces this caller may see and answer in"""


class Auth:
    def __init__(self, config: WebConfig, sessions: SessionStore, throttle: Throttle) -> None:
        self.config, self.sessions, self.throttle = config, sessions, throttle

    def address(self, request: Request) -> str:
        return client_address(request, self.config.trusted_proxies)

    async def identify(self, request: Request) -> Identity:
        """The caller, or 401 (429 when this address guessed too many tokens)."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token:
            address = self.address(request)
            await self.throttle.check_token(address)
            owner = self.config.credentials.token_owner(token.strip())
            if owner is None:
                await self.throttle.token_failed(address)
                raise unauthenticated("unknown token")
            return Identity(owner, None, self._allowed(owner))
        record = await self._session(request)
        if record is None:
            raise unauthenticated()
        return self.identity_of(record)

    def identity_of(self, record: SessionRecord) -> Identity:
        return Identity(record.user, record.csrf, self._allowed(record.user))

    def _allowed(self, name: str) -> tuple[str, ...]:
        return self.config.credentials.allowed(name, self.config.namespaces)

    async def identify_for_change(self, request: Request) -> Identity:
        """The caller of a state-changing request: a cookie session must pass the CSRF check."""
        identity = await self.identify(request)
        if identity.csrf is not None:
            check_same_origin(request)
            given = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), identity.csrf.encode()):
                raise WebError(403, "CSRF", "missing or wrong CSRF token")
        return identity

    async def sign_in(self, request: Request, body: Any) -> tuple[str, SessionRecord]:
        """Check a user name and password (or a token) from ``body``; a new session, or 401/429.

        Every attempt is counted before it is checked (and given back when it succeeds),
        so parallel guesses cannot slip past the limit. A known and an unknown user name
        cost the same: one scrypt.
        """
        address = self.address(request)
        fields = body if isinstance(body, dict) else {}
        named = fields.get("user")
        user = named[:_MAX_NAME] if isinstance(named, str) and "token" not in fields else None
        await self.throttle.take_sign_in(user, address)
        owner: str | None = None
        token, password = fields.get("token"), fields.get("password")
        if isinstance(token, str):
            owner = self.config.credentials.token_owner(token)
        elif user is not None and isinstance(password, str):
            owner = user if self.config.credentials.check_password(user, password) else None
        if owner is None:
            raise unauthenticated("wrong user name, password or token")
        await self.throttle.give_back_sign_in(user, address)
        return await self.sessions.create(owner, address=address, agent=request.headers.get("user-agent", ""))

    async def sign_out(self, request: Request) -> None:
        cookie = request.cookies.get(COOKIE)
        if cookie:
            await self.sessions.end(cookie)

    async def _session(self, request: Request) -> SessionRecord | None:
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            return None
        record = await self.sessions.get(cookie)
        if record is None:
            return None
        credentials = self.config.credentials
        if record.user not in credentials.users and record.user not in credentials.tokens:
            return None  # removed from the configuration since
        return record

    def set_cookie(self, response: Response, cookie: str) -> None:
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=int(self.config.session_max_age),
            httponly=True,
            samesite="strict",
            secure=self.config.secure_cookies,
            path="/",
        )

    def clear_cookie(self, response: Response) -> None:
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=self.config.secure_cookies)


def check_same_origin(request: Request) -> None:
    """Refuse a browser request that another site made (Fetch metadata, then Origin)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise WebError(403, "CSRF", "cross-site request refused")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise WebError(403, "CSRF", "cross-origin request refused")
