"""Plain-text tables and durations, as the operators' commands (``status``, ``decisions``) print them."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["duration", "table"]


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The headers, a rule under them, then a line a row, each column as wide as its widest cell."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def duration(seconds: float) -> str:
    """``42s``, ``3m07s`` or ``2h05m``: as precise as a glance needs."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
