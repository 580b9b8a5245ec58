"""What an ask may say besides its request, written once for ``Broker.ask``, ``Broker.ask_as`` and ``Agent.ask``.

``AskOptions`` is their keyword options (``**options: Unpack[AskOptions]``); ``plan`` checks them and
turns them into what the ask keeps: a ``Durable`` (a keyed ask's key and detach grace) and a ``Routing``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from dataclasses import dataclass
from typing import TypedDict

from ..errors import BAD_REQUEST, UserQuestionError

__all__ = ["DEFAULT_ROUTING", "AskOptions", "Durable", "Routing", "plan", "routing_of"]


class AskOptions(TypedDict, total=False):
    """The keyword options of an ask; each may be left out."""

    abort: asyncio.Event | None
    """set it to withdraw the question (``ASK_ABORTED``)"""
    timeout: float | None
    """seconds until the question is withdrawn unanswered (``ASK_TIMED_OUT``)"""
    key: str | None
    """names the question durably (per namespace and asking agent id): if this process stops, the question
    stays pending for ``detach_grace`` seconds (the broker's by default), and a new live instance asking the
    same request with the same key re-attaches to it"""
    detach_grace: float | None
    """a keyed ask's grace, in seconds (0 to 30 days)"""
    remember: bool
    """False: always ask a human, even when a remembered decision matches (and no provider may remember the
    answer)"""
    coalesce: bool
    """False: never presented together with identical pending requests of other askers"""


_NAMES = AskOptions.__optional_keys__
_KEY = re.compile(r"^[^\x00-\x20\x7f]{1,200}$")


@dataclass(frozen=True)
class Durable:
    """A keyed ask's key and detach grace."""

    key: str
    grace_ms: int

    @staticmethod
    def digest(wire: bytes) -> str:
        """What makes two asks under one key the same request: their wire JSON."""
        return hashlib.sha1(wire).hexdigest()


@dataclass(frozen=True)
class Routing:
    """What may answer an ask besides a human answering it alone."""

    remember: bool = True
    """a remembered decision may answer it, and its answer may be remembered"""
    coalesce: bool = True
    """it may be presented once with identical pending requests of other askers"""
    lookup: bool = True
    """look remembered decisions up (False after a lookup found one that does not verify)"""

    def __post_init__(self) -> None:
        for name in ("remember", "coalesce"):
            if not isinstance(getattr(self, name), bool):
                raise UserQuestionError(f"{name} must be True or False", BAD_REQUEST)


DEFAULT_ROUTING = Routing()
_ROUTINGS = {
    (remember, coalesce): Routing(remember, coalesce) for remember in (True, False) for coalesce in (True, False)
}


def routing_of(remember: bool, coalesce: bool) -> Routing:
    """The routing of an ask's ``remember`` and ``coalesce``: one shared record per choice (else a record per
    waiting ask); anything but True or False is refused as ``Routing`` refuses it."""
    if type(remember) is bool and type(coalesce) is bool:
        return _ROUTINGS[(remember, coalesce)]
    return Routing(remember, coalesce)


def plan(options: AskOptions, detach_grace: float) -> tuple[Durable | None, Routing]:
    """Check an ask's options (``detach_grace``: the broker's default); its durability and routing."""
    unknown = options.keys() - _NAMES
    if unknown:
        raise TypeError(f"ask() got an unexpected keyword argument {min(unknown)!r}")
    durable = _durable(options.get("key"), options.get("detach_grace"), detach_grace)
    return durable, routing_of(options.get("remember", True), options.get("coalesce", True))


def _durable(key: object, grace: object, default: float) -> Durable | None:
    if key is None:
        if grace is not None:
            raise UserQuestionError("detach_grace applies to a keyed ask only: pass key= too", BAD_REQUEST)
        return None
    if not isinstance(key, str) or not _KEY.match(key):
        raise UserQuestionError(
            f"key {key!r} must be 1-200 characters with no spaces or control characters", BAD_REQUEST
        )
    grace = default if grace is None else grace
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 30 * 86_400:
        raise UserQuestionError(f"detach_grace {grace!r} must be 0 to 30 days, in seconds", BAD_REQUEST)
    return Durable(key, int(grace * 1000))
