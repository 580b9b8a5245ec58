"""The Lua scripts of ``broker/scripts``, loaded once at import: their helpers included, their SHAs computed.

A script names each helper it uses on a line of its own, ``--! include _audit``; that line is
replaced by the helper's code joined onto one line, so that an error's line number is still
the script file's (an error inside a helper reports its include line). A helper may include
another the same way; each is included once per script, before the first that needs it.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources

__all__ = ["SCRIPTS", "Script", "helpers_of"]

_INCLUDE = re.compile(r"^--! include (_\w+)$", re.M)


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text()


def helpers_of(source: str) -> list[str]:
    """The helpers a script or helper includes itself, in order (not those they include in turn)."""
    return _INCLUDE.findall(source)


def _one_line(name: str, included: set[str], within: tuple[str, ...]) -> str:
    """A helper's code on one line, its own includes in front: its comment lines dropped, the rest joined."""
    source = _read(name)
    code: list[str] = []
    for line in source.splitlines():
        line = line.strip()
        if _INCLUDE.match(line):
            code.append(_included(line, included, (*within, name)))
        elif line and not line.startswith("--"):
            if "--" in line:
                raise ValueError(f"helper {name} may have whole-line comments only: it is joined onto one line")
            code.append(line)
    return " ".join(part for part in code if part)


def _included(line: str, included: set[str], within: tuple[str, ...]) -> str:
    """The code an include line stands for; '' for a helper this script has already."""
    name = line.removeprefix("--! include ")
    if name in within:
        raise ValueError(f"helper {name} includes itself, through {' -> '.join(within)}")
    if name in included:
        return ""
    included.add(name)
    return _one_line(name, included, within)


def _with_helpers(name: str, source: str) -> str:
    """The script with each ``--! include`` line replaced by that helper's code, on that one line."""
    included: set[str] = set()
    lines = source.split("\n")
    for i, line in enumerate(lines):
        if _INCLUDE.match(line):
            lines[i] = _included(line, included, (name,))
    return "\n".join(lines)


class Script:
    """A Lua script from ``broker/scripts``; run by SHA, reloaded after NOSCRIPT.

    Each starts with ``#!lua`` so that Redis 7 refuses it on a read-only replica (READONLY,
    which a Sentinel client turns into a reconnect to the master) rather than answering
    from the replica's state. ``plain`` is the same script without that line, for fakeredis,
    which does not know it.
    """

    __slots__ = ("batches", "name", "plain", "plain_sha", "sha", "source")

    def __init__(self, name: str, *, batches: bool = False) -> None:
        self.name = name
        self.batches = batches
        """takes several calls in one: ARGV[1] '*', ARGV[2] n, then n (key count, argument count) pairs"""
        self.source = _with_helpers(name, _read(name))
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        self.plain = self.source.removeprefix("#!lua\n")
        self.plain_sha = hashlib.sha1(self.plain.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.name!r})"


SCRIPTS = {
    name: Script(name, batches=name == "ask")
    for name in (
        "ask",
        "deliver",
        "settle",
        "approve",
        "withdraw",
        "detach",
        "deadletter",
        "lease_acquire",
        "lease_renew",
        "lease_release",
        "agent_register",
        "agent_heartbeat",
        "notice_ack",
        "settled_cleanup",
        "durable_release",
        "decision_revoke",
        "audit_append",
        "reap",
        "expire",
        "standbys_prune",
        "audit_cursor",
        "away_end",
    )
}
"""every script, by file name (the helpers, ``scripts/_*.lua``, are no scripts of their own)"""
