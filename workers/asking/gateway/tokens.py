"""Per-agent bearer tokens: what decides who is asking through the gateway (and ``qbroker mcp --http``).

A tokens file holds one ``AGENT_ID SHA256_HEX`` line per token (``#`` comments, blank lines); the
token itself is printed once, when made, and never stored. A caller presenting a token is the
agent on its line: it cannot name another. The file is read again whenever it changes, so a new or
revoked token counts at the next request, without a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["TOKEN_PREFIX", "TokenFileError", "Tokens", "bearer", "new_token", "revoke_tokens", "token_agents"]

TOKEN_PREFIX: Final = "qbgt1_"
_AGENT_ID: Final = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")
_DIGEST: Final = re.compile(r"^[0-9a-f]{64}$")


class TokenFileError(ValueError):
    """A tokens file that cannot be read or has a bad line (the message names the line)."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class _Entry:
    agent_id: str
    digest: bytes


def _parse(path: Path) -> tuple[_Entry, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except OSError as error:
        raise TokenFileError(f"cannot read the tokens file {path}: {error.strerror}") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2 or not _AGENT_ID.match(fields[0]) or not _DIGEST.match(fields[1]):
            raise TokenFileError(f"{path}:{number}: expected 'AGENT_ID SHA256_HEX'")
        entries.append(_Entry(fields[0], bytes.fromhex(fields[1])))
    return tuple(entries)


class Tokens:
    """The agents' token digests, read from a file and re-read when it changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = os.fspath(self.path)
        self._stamp: tuple[int, int, int] | None = None
        self._entries: tuple[_Entry, ...] = ()
        self._agents: dict[bytes, str] = {}
        self._refresh()

    def __repr__(self) -> str:
        return f"Tokens(path={str(self.path)!r}, count={len(self._entries)})"

    def __len__(self) -> int:
        self._refresh()
        return len(self._entries)

    def _refresh(self) -> None:
        try:
            stat = os.stat(self._file)  # on every request: os's, without pathlib's steps around it
            stamp: tuple[int, int, int] | None = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp or stamp is None:
            # A file that turned bad keeps the last good tokens rather than letting everyone in or out.
            entries = _parse(self.path)
            agents: dict[bytes, str] = {}
            for entry in entries:
                agents.setdefault(entry.digest, entry.agent_id)  # the first line of a digest, as before
            self._entries, self._agents = entries, agents
            self._stamp = stamp

    def agent_for(self, token: str) -> str | None:
        """The agent a token belongs to, or None.

        Found by the token's SHA-256 in a table of the file's digests, in one step whatever the
        number of agents (comparing against every entry cost 0.2 ms a request at 1,000 agents).
        What the lookup's time could tell is about the digest, and no caller can steer a digest
        toward a valid one without the token itself: a near guess of a token has an unrelated digest.
        """
        with contextlib.suppress(TokenFileError):  # a file turned bad: the last good tokens stay
            self._refresh()
        if not token.startswith(TOKEN_PREFIX):
            return None
        return self._agents.get(_digest(token))


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer TOKEN`` header ('' when absent or another scheme)."""
    if not header:
        return ""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def new_token(path: str | os.PathLike[str], agent_id: str) -> str:
    """Make a token for ``agent_id``, add its digest to the file (0600), and return the token.

    An agent may hold several tokens at once (rotation: make the new one, switch, revoke the old).
    """
    if not _AGENT_ID.match(agent_id):
        raise TokenFileError(f"agent id {agent_id!r} must be 1-200 characters with no spaces or control characters")
    file = Path(path)
    _parse(file)  # never append to a file that is already bad
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as out:
        out.write(f"{agent_id} {_digest(token).hex()}\n")
    return token


def revoke_tokens(path: str | os.PathLike[str], agent_id: str) -> int:
    """Remove every token of ``agent_id``; returns how many there were."""
    file = Path(path)
    _parse(file)
    try:
        lines = file.read_text(encoding="utf-8").splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    kept = [line for line in lines if line.split("#", 1)[0].split()[:1] != [agent_id]]
    removed = len(lines) - len(kept)
    if removed:
        temporary = file.with_name(file.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.writelines(kept)
        os.replace(temporary, file)
    return removed


def token_agents(path: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """Each agent of the file with how many tokens it has, in file order."""
    counts: dict[str, int] = {}
    for entry in _parse(Path(path)):
        counts[entry.agent_id] = counts.get(entry.agent_id, 0) + 1
    return list(counts.items())
