"""Telling "Redis is away for a moment" from real failures, for workers that must keep serving."""

from __future__ import annotations

from redis.exceptions import RedisError

from broker import UserQuestionError
from broker.errors import BROKER_UNAVAILABLE

__all__ = ["describe", "redis_trouble"]


def redis_trouble(error: BaseException) -> bool:
    """True when ``error`` (or every error of a group) is a connection or Redis failure."""
    if isinstance(error, BaseExceptionGroup):
        return all(redis_trouble(inner) for inner in error.exceptions)
    if isinstance(error, UserQuestionError):
        return error.code == BROKER_UNAVAILABLE
    return isinstance(error, OSError | RedisError)


def describe(error: BaseException) -> str:
    """The first leaf error's text (a TaskGroup's group says nothing useful itself)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return str(error) or type(error).__name__
