"""The web layer's refusals: ``{name, code, message}`` with an HTTP status (and headers)."""

from __future__ import annotations

from collections.abc import Mapping

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["REDIS_DOWN", "WebError", "unauthenticated"]

REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
"""what a read or write of Redis raises while Redis does not answer (the web server waits it out)"""


class WebError(Exception):
    """A refusal of the web layer, sent as ``{name, code, message}`` with ``status``."""

    name = "WebError"

    def __init__(self, status: int, code: str, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"WebError(status={self.status}, code={self.code!r}, message={self.message!r})"

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "code": self.code, "message": self.message}


def unauthenticated(message: str = "sign in first") -> WebError:
    return WebError(401, "UNAUTHENTICATED", message)
