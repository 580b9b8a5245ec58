"""Who is asking: bearer tokens for scripts, signed session cookies for people; CSRF checks.

A session cookie holds the user name and a per-session CSRF token, signed (itsdangerous)
and HttpOnly, SameSite=Strict. Every state-changing request made with the cookie must
echo the CSRF token in ``X-CSRF-Token`` (the page reads it from ``GET /api/session``);
requests with a bearer token carry no ambient credential and need no CSRF token.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from itsdangerous import BadSignature, URLSafeTimedSerializer
from starlette.requests import Request
from starlette.responses import Response

from .config import WebConfig

__all__ = ["COOKIE", "Identity", "Sessions", "SignInThrottle", "WebError", "new_csrf_token"]

COOKIE = "qb_session"
CSRF_HEADER = "x-csrf-token"


class WebError(Exception):
    """A refusal of the web layer, sent as ``{name, code, message}`` with ``status``."""

    name = "WebError"

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def __repr__(self) -> str:
        return f"WebError(status={self.status}, code={self.code!r}, message={self.message!r})"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "code": self.code, "message": self.message}


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


def unauthenticated() -> WebError:
    return WebError(401, "UNAUTHENTICATED", "sign in first")


@dataclass(frozen=True)
class Identity:
    user: str
    csrf: str | None
    """the session's CSRF token; ``None`` for a bearer token"""


class Sessions:
    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self._serializer = URLSafeTimedSerializer(config.secret, salt="qbroker-web-session")

    def identify(self, request: Request) -> Identity:
        """The caller, or 401."""
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token:
            owner = self.config.credentials.token_owner(token.strip())
            if owner is None:
                raise WebError(401, "UNAUTHENTICATED", "unknown token")
            return Identity(owner, None)
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            raise unauthenticated()
        try:
            data: Any = self._serializer.loads(cookie, max_age=self.config.session_max_age)
        except BadSignature as error:
            raise unauthenticated() from error
        if not isinstance(data, dict) or not isinstance(data.get("u"), str) or not isinstance(data.get("c"), str):
            raise unauthenticated()
        if data["u"] not in self.config.credentials.users and data["u"] not in self.config.credentials.tokens:
            raise unauthenticated()  # removed from the configuration since
        return Identity(data["u"], data["c"])

    def identify_for_change(self, request: Request) -> Identity:
        """The caller of a state-changing request: a cookie session must pass the CSRF check."""
        identity = self.identify(request)
        if identity.csrf is not None:
            check_same_origin(request)
            given = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), identity.csrf.encode()):
                raise WebError(403, "CSRF", "missing or wrong CSRF token")
        return identity

    def sign_in(self, response: Response, user: str, csrf: str) -> None:
        response.set_cookie(
            COOKIE,
            self._serializer.dumps({"u": user, "c": csrf}),
            max_age=self.config.session_max_age,
            httponly=True,
            samesite="strict",
            secure=self.config.secure_cookies,
            path="/",
        )

    def sign_out(self, response: Response) -> None:
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=self.config.secure_cookies)


def check_same_origin(request: Request) -> None:
    """Refuse a browser request that another site made (Fetch metadata, then Origin)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise WebError(403, "CSRF", "cross-site request refused")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise WebError(403, "CSRF", "cross-origin request refused")


class SignInThrottle:
    """At most ``limit`` failed sign-ins per client address in ``window`` seconds."""

    def __init__(self, *, limit: int = 10, window: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self._failures: dict[str, deque[float]] = {}

    def check(self, client: str) -> None:
        failures = self._recent(client)
        if len(failures) >= self.limit:
            raise WebError(429, "TOO_MANY_ATTEMPTS", "too many failed sign-ins; try again later")

    def failed(self, client: str) -> None:
        self._recent(client).append(self.clock())
        if len(self._failures) > 10_000:  # forget the oldest addresses rather than grow without bound
            self._failures.pop(next(iter(self._failures)))

    def _recent(self, client: str) -> deque[float]:
        failures = self._failures.setdefault(client, deque())
        horizon = self.clock() - self.window
        while failures and failures[0] < horizon:
            failures.popleft()
        return failures
