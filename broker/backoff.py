"""Exponential delays between attempts, reset after a success (the library's and the workers' one pacing)."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Delays from ``first`` doubling up to ``cap`` seconds; ``reset()`` after a success starts again at ``first``."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self.delay = first

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first
