"""The local user answers too: noticing that Claude Code's own dialog decided a call first.

In an interactive session Claude Code shows its permission dialog while a ``PermissionRequest``
hook runs and applies whichever decides first; the hook is not told when the user wins, and
would keep the team's card up until its timeout. What the dialog decided does reach the
session's transcript (``transcript_path``, in every hook payload): the call's ``tool_result``
(the tool's output once allowed, the rejection once denied, the interruption on Esc). So the
hook finds its call there and watches for that result, then withdraws the team's question.

A ``PermissionRequest`` payload carries no ``tool_use_id``: the call is the one ``tool_use`` of
the same tool and input without a result yet. Its id is also the call's identity for the
question's key (``workers.asking.claude_hook.hook.key_for``), so it must be this call's and no
other's: a call it cannot find (no transcript, a subagent's call, which its own transcript holds)
or cannot tell apart (two identical calls without a result) is neither watched nor keyed by it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from workers.asking.claude_hook.questions import HookPayload

__all__ = ["Transcript"]

_TAIL: Final = 4 * 1024 * 1024
"""how much of the transcript's end is searched for the call: its tool_use was written just now"""
_POLL: Final = 0.25
"""a file offers no blocking read (and inotify is not in the standard library): its size is polled"""


def _blocks(line: bytes) -> list[dict[str, Any]]:
    """The content blocks of one transcript line (nothing for a line that is not a message)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return []
    message = entry.get("message") if isinstance(entry, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []


def _results(lines: list[bytes]) -> set[str]:
    return {
        str(block.get("tool_use_id")) for line in lines for block in _blocks(line) if block.get("type") == "tool_result"
    }


@dataclass(frozen=True)
class Transcript:
    """One tool call in one session's transcript, to be watched for its result."""

    path: Path
    tool_use_id: str
    offset: int
    """where the search ended: a result written later is read from here"""

    @classmethod
    def of(cls, payload: HookPayload) -> Transcript | None:
        if not payload.transcript_path:
            return None
        path = Path(payload.transcript_path)
        try:
            with path.open("rb") as file:
                size = file.seek(0, 2)
                file.seek(max(0, size - _TAIL))
                tail = file.read(size - file.tell())
        except OSError:
            return None
        lines = tail.split(b"\n")
        if payload.tool_use_id:
            return cls(path, payload.tool_use_id, size)
        answered = _results(lines)
        waiting = {
            str(block.get("id"))
            for line in lines
            for block in _blocks(line)
            if block.get("type") == "tool_use"
            and isinstance(block.get("id"), str)
            and block.get("name") == payload.tool_name
            and block.get("input") == payload.tool_input
        } - answered
        if len(waiting) != 1:  # none, or identical calls this one cannot be told from
            return None
        return cls(path, waiting.pop(), size)

    async def decided(self) -> None:
        """Returns once the call's result is in the transcript."""
        offset, partial = self.offset, b""
        while True:
            try:
                with self.path.open("rb") as file:
                    size = file.seek(0, 2)
                    if size < offset:  # rewritten: read it again from the start
                        offset, partial = 0, b""
                    file.seek(offset)
                    partial += file.read(size - offset)
                    offset = size
            except OSError:
                pass  # moved away for a moment; the call is still undecided as far as we know
            *lines, partial = partial.split(b"\n")
            if self.tool_use_id in _results(lines):
                return
            await asyncio.sleep(_POLL)
