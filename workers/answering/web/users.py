"""The users file of a running ``qbroker web``, read again when it changes: revoking a person takes
effect at their next request (DESIGN invariant 15), without a restart.

One file says who signs in (``[users]``, ``[tokens]``), where (``[namespaces]``), in which groups
(``[groups]``, for quorum and routing policies) and who each Slack user is (``[slack]``). Each use
looks at the file (``workers._watched_file``: one stat) and takes what it says now:

- a session carries the grant it signed in with (``Credentials.grant``); a removed or changed user's
  sessions end at their next request, and an open event stream is told to check at once;
- a sign-in, a bearer token and a Slack click are judged by the file as it is;
- the policies' groups are a view of the file, so the next vote is judged by who is in them now.

A file turned bad keeps what it said last (logged as ``USERS_FILE_INVALID``); a file that is gone
lets nobody in (the ``--token`` flags still hold: they are not in the file).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from broker import Policies
from workers._watched_file import WatchedFile
from workers.answering.slack.config import slack_users
from workers.answering.web.config import ConfigError, Credentials, credentials_from

__all__ = ["USERS_FILE_INVALID", "UsersFile", "unmet_policies"]

USERS_FILE_INVALID = "USERS_FILE_INVALID"
"""logged when a running server's users file turns unreadable, malformed or gone"""


@dataclass(frozen=True)
class _Content:
    credentials: Credentials
    slack: Mapping[str, str] = field(default_factory=dict)
    """Slack member id or email -> broker user (``[slack]``; empty without a Slack face)"""


class UsersFile:
    """A users file and the ``--token`` flags: the credentials, groups and Slack mapping they give now."""

    def __init__(self, path: Path, tokens: list[str] | None = None, *, slack: bool = False) -> None:
        """Reads the file; ``ConfigError`` when it cannot be read or is malformed (the server does not start)."""
        self._tokens, self._slack = list(tokens or ()), slack
        self.path = path
        try:
            self._file = WatchedFile(
                path, self._parse, missing=_Content(credentials_from({}, str(path), self._tokens)),
                code=USERS_FILE_INVALID,
            )  # fmt: skip
        except ConfigError:
            raise
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"cannot read users file {path}: {error}") from error
        except ValueError as error:  # a malformed [slack]: its message names the file
            raise ConfigError(str(error)) from error

    def __repr__(self) -> str:
        return f"UsersFile(path={str(self.path)!r})"  # no names, no hashes

    def _parse(self, text: str) -> _Content:
        data = tomllib.loads(text)  # TOMLDecodeError is a ValueError: the file is malformed
        return _Content(
            credentials_from(data, str(self.path), self._tokens),
            slack_users(data, str(self.path)) if self._slack else {},
        )

    def current(self) -> Credentials:
        """The credentials the file gives now (read again first if it changed)."""
        return self._file.current().credentials

    @property
    def last(self) -> Credentials:
        """The credentials as last read, without looking at the file."""
        return self._file.last.credentials

    def refresh(self) -> bool:
        """Read the file again if it changed; True when what it says did."""
        return self._file.refresh()

    def on_change(self, listener: Callable[[Credentials], None]) -> Callable[[], None]:
        """Call ``listener`` with the new credentials whenever a change is read; returns what stops that."""
        return self._file.on_change(lambda content: listener(content.credentials))

    def slack_users(self) -> Mapping[str, str]:
        """``[slack]`` as a view: each lookup reads the file again first if it changed (a click, a mention)."""
        return _Live(lambda: self._file.current().slack)

    def groups(self, fixed: Mapping[str, frozenset[str]] | None = None) -> Mapping[str, frozenset[str]]:
        """``[groups]`` as a view, with ``fixed`` groups (a policy file's own, which win on a clash).

        It looks at what was last read, not at the file: it is asked once a card for every card
        shown, and every request that can vote (a page's, a token's, a Slack click) has just read
        the file (as the server does once a second besides)."""
        return _Groups(self._file, dict(fixed or {}))


class _Live(Mapping[str, str]):
    def __init__(self, now: Callable[[], Mapping[str, str]]) -> None:
        self._now = now

    def __getitem__(self, key: str) -> str:
        return self._now()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


class _Groups(Mapping[str, frozenset[str]]):
    def __init__(self, file: WatchedFile[_Content], fixed: dict[str, frozenset[str]]) -> None:
        self._file, self._fixed = file, fixed
        self._seen: _Content | None = None
        self._merged: dict[str, frozenset[str]] = {}

    def _now(self) -> dict[str, frozenset[str]]:
        content = self._file.last
        if content is not self._seen:  # merged once per version of the file, not once a lookup
            self._merged, self._seen = {**content.credentials.groups, **self._fixed}, content
        return self._merged

    def __getitem__(self, key: str) -> frozenset[str]:
        return self._now()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


def unmet_policies(policies: Policies) -> list[str]:
    """What the groups as they are now leave a policy unable to do (said when the users file changes)."""
    problems: list[str] = []
    for policy in policies.policies:
        for group in (*policy.groups, policy.route, policy.escalate_to):
            if group and group not in policies.groups:
                problems.append(f"policy {policy.name!r}: no group {group!r}")
        voters = policies.voters(policy)
        if voters is not None and len(voters) < policy.approvals:
            problems.append(
                f"policy {policy.name!r} needs {policy.approvals} approvals but its groups have {len(voters)} members"
            )
    return problems
