"""Who is asking: bearer tokens for scripts, server-side sessions for people; CSRF checks.

A session cookie holds only a random session id (HttpOnly, SameSite=Strict); the
session itself (user, CSRF token) lives in Redis (see ``sessions``). Every
state-changing request made with the cookie must echo the session's CSRF token in
``X-CSRF-Token`` (the page reads it from ``GET /api/session``); requests with a bearer
token carry no ambient credential and need no CSRF token. Failed sign-ins and token
guesses are throttled (see ``throttle``). Each request is judged by the users file as it is
now: a session ends at its next request once its person was removed or changed there.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from workers.answering.web.config import Credentials, WebConfig
from workers.answering.web.errors import WebError, unauthenticated
from workers.answering.web.sessions import SessionRecord, SessionStore
from workers.answering.web.throttle import Throttle, client_address

__all__ = ["COOKIE", "Auth", "Identity", "check_same_origin"]

COOKIE = "qb_session"
CSRF_HEADER = "x-csrf-token"
_MAX_NAME = 200

log = logging.getLogger(__name__)


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
        credentials = self.config.credentials.current()
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token:
            address = self.address(request)
            await self.throttle.check_token(address)
            owner = credentials.token_owner(token.strip())
            if owner is None:
                await self.throttle.token_failed(address)
                raise unauthenticated("unknown token")
            return Identity(owner, None, self._allowed(credentials, owner))
        record = await self._session(request, credentials)
        if record is None:
            raise unauthenticated()
        return Identity(record.user, record.csrf, self._allowed(credentials, record.user))

    def identity_of(self, record: SessionRecord) -> Identity:
        return Identity(record.user, record.csrf, self._allowed(self.config.credentials.current(), record.user))

    def _allowed(self, credentials: Credentials, name: str) -> tuple[str, ...]:
        return credentials.allowed(name, self.config.namespaces)

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
        missing = _missing(fields)
        if missing is not None:
            # Said from the fields alone (a known and an unknown name read the same); counted like a
            # malformed try, against the address only: it guesses nothing, but costs a request.
            await self.throttle.take_sign_in(None, address)
            raise WebError(400, "MISSING_CREDENTIALS", missing)
        named = fields.get("user")
        user = named[:_MAX_NAME] if isinstance(named, str) and "token" not in fields else None
        await self.throttle.take_sign_in(user, address)
        owner: str | None = None
        credentials = self.config.credentials.current()
        token, password = fields.get("token"), fields.get("password")
        if isinstance(token, str):
            owner = credentials.token_owner(token)
        elif user is not None and isinstance(password, str):
            owner = user if credentials.check_password(user, password) else None
        grant = None if owner is None else credentials.grant(owner)
        if owner is None or grant is None:
            raise unauthenticated("wrong user name, password or token")
        await self.throttle.give_back_sign_in(user, address)
        return await self.sessions.create(
            owner, grant=grant, address=address, agent=request.headers.get("user-agent", "")
        )

    async def sign_out(self, request: Request) -> None:
        cookie = request.cookies.get(COOKIE)
        if cookie:
            await self.sessions.end(cookie)

    async def _session(self, request: Request, credentials: Credentials) -> SessionRecord | None:
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            return None
        record = await self.sessions.get(cookie)
        if record is None:
            return None
        if record.grant != credentials.grant(record.user):
            # Removed or changed in the users file since it signed in: the session ends (on every
            # server; they read the same file), not only this request.
            await self.sessions.end(cookie)
            log.info("ended a session of %s: the users file no longer says what it said at sign-in", record.user)
            return None
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


def _missing(fields: dict[str, Any]) -> str | None:
    """What an empty sign-in lacks, from which fields are empty, never from who exists; None when nothing."""

    def given(name: str) -> bool:
        value = fields.get(name)
        return isinstance(value, str) and bool(value if name == "password" else value.strip())

    if given("token"):
        return None
    user, password = given("user"), given("password")
    if not user and not password:
        return "type your user name and password (or a token)"
    if not password:
        return "type your password"
    if not user:
        return "type your user name"
    return None


def check_same_origin(request: Request) -> None:
    """Refuse a browser request that another site made (Fetch metadata, then Origin)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise WebError(403, "CSRF", "cross-site request refused")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise WebError(403, "CSRF", "cross-origin request refused")
