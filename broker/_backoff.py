"""Exponential delays between attempts, reset after a success."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    def __init__(self, first: float = 0.05, cap: float = 2.0) -> None:
        self.first = first
        self.cap = cap
        self.delay = first

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first
