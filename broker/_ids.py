"""Ids unique without a system call each: a random prefix per owner, then a counter."""

from __future__ import annotations

import itertools
import secrets

__all__ = ["UniqueIds"]


class UniqueIds:
    """24 hex digits: 48 random bits drawn once per instance, then a 48-bit counter.

    Unique across processes by the prefix and within one by the counter; ``secrets.token_hex``
    per id cost a ``getrandom`` call per ask on each side (3-5 % of a busy asker's or
    provider's CPU). Not secrets: request and settle call ids are names, not capabilities.
    """

    __slots__ = ("_counter", "_prefix")

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6)
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):012x}"
