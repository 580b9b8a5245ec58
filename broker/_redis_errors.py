"""What a Redis failure means to the broker: wait it out, or report it.

redis-py turns some error replies into exception classes and strips the code from the
message (``READONLY ...`` becomes ``ReadOnlyError("You can't write ...")``), so errors are
classified by class first and by reply prefix only for replies it leaves as plain
``ResponseError`` (a plain client's ``MASTERDOWN``, ``CLUSTERDOWN``, ``UNBLOCKED``).
"""

from __future__ import annotations

import os

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

from .errors import BROKER_UNAVAILABLE, UserQuestionError

__all__ = ["REDIS_DOWN", "TRANSIENT", "describe", "is_transient", "unavailable"]

REDIS_DOWN = (ConnectionError, TimeoutError, OSError)
"""The connection broke or a reply did not come in time (asyncio's TimeoutError is an OSError)."""

TRANSIENT = (
    *REDIS_DOWN,
    BusyLoadingError,  # LOADING: a restarted server still reading its AOF
    ReadOnlyError,  # READONLY: a demoted master or a replica; the client reconnects to the master
    OutOfMemoryError,  # OOM under noeviction: writes resume once memory is freed
    ClusterDownError,  # CLUSTERDOWN, MASTERDOWN (a subclass): a failover in progress
    TryAgainError,  # TRYAGAIN: a slot moving during resharding
    RedisClusterException,  # the cluster client could not map a slot or reach any node yet
)
_TRANSIENT_REPLIES = ("UNBLOCKED", "READONLY", "MASTERDOWN", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "OOM", "BUSY ")
_PERMANENT = (AuthenticationError, AuthorizationError)  # ConnectionError subclasses that retrying cannot mend


def is_transient(error: BaseException) -> bool:
    """True when waiting and trying again may succeed: "this server cannot serve you right now"."""
    if isinstance(error, UserQuestionError):
        return error.code == BROKER_UNAVAILABLE
    if isinstance(error, _PERMANENT):
        return False
    if isinstance(error, TRANSIENT):
        return True
    return isinstance(error, ResponseError) and str(error).startswith(_TRANSIENT_REPLIES)


def describe(error: BaseException) -> str:
    """What went wrong, in words an operator can act on: the reply or the socket error, and what
    an errno means ("Connect call failed" alone does not say the port refused)."""
    text = str(error) or type(error).__name__
    cause = error.__cause__ or error.__context__
    number = getattr(cause, "errno", None) or getattr(error, "errno", None)
    if isinstance(number, int) and number > 0:
        meaning = os.strerror(number)
        if meaning.lower() not in text.lower():
            text = f"{text} ({meaning})"
    return text


def unavailable(error: BaseException, doing: str) -> UserQuestionError:
    """The coded error an ask or provider call gets for a Redis failure it cannot wait out."""
    if isinstance(error, UserQuestionError):
        return error
    kind = type(error).__name__
    return UserQuestionError(f"Redis failed while {doing}: {kind}: {error}", BROKER_UNAVAILABLE)
