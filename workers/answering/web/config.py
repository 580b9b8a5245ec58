"""The web provider's settings: one frozen object built at the process edge.

Who may sign in comes from a TOML users file and/or ``--token NAME=TOKEN`` flags::

    [users]                      # name = password hash (``qbroker web --hash-password``)
    alice = "scrypt$16384$8$1$<salt hex>$<key hex>"

    [tokens]                     # name = bearer token, for scripts (and sign-in with a token)
    ci-bot = "a long random string"

    [namespaces]                 # optional: who may answer where, when one server serves several
    alice = ["team-a", "team-b"]
    ci-bot = ["team-a"]

Without a ``[namespaces]`` table everyone may answer in every namespace the server serves;
with one, a name may answer only in the namespaces listed for it (none when it is not listed).
``[groups]`` (docs/approvals.md) and ``[slack]`` (docs/slack.md) live in the same file. A running
server reads it again when it changes (``workers.answering.web.users``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from broker import Policies
from broker.answering.quorum import load_groups
from workers.answering.slack.config import SlackConfig
from workers.answering.web.throttle import Network, ThrottleLimits
from workers.passwords import hash_password, unmatchable_hash, verify_password  # in workers/: quickstart uses them

__all__ = [
    "ConfigError",
    "CredentialSource",
    "Credentials",
    "WebConfig",
    "credentials_from",
    "hash_password",
    "load_credentials",
    "verify_password",
]


class ConfigError(ValueError):
    """The users file or a flag is malformed."""


_UNKNOWN_USER_HASH = unmatchable_hash()
"""what an unknown name's password is checked against: one scrypt, as for a known name"""


@dataclass(frozen=True)
class Credentials:
    """Password hashes by user name and bearer tokens by name; never shown in a repr."""

    users: dict[str, str] = field(default_factory=dict, repr=False)
    tokens: dict[str, str] = field(default_factory=dict, repr=False)
    namespaces: dict[str, tuple[str, ...]] | None = None
    """who may answer where (``[namespaces]``); ``None``: everyone everywhere served"""
    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """``[groups]`` of the users file (docs/approvals.md)"""
    _grants: dict[str, str | None] = field(default_factory=dict, init=False, repr=False, compare=False)

    def current(self) -> Credentials:
        """These credentials (a fixed set; a ``UsersFile`` gives the file's as it is now)."""
        return self

    def grant(self, name: str) -> str | None:
        """What a session of ``name`` is bound to: a digest of all the file says ``name`` is and may do
        (password hash, token, namespaces, groups); ``None`` when ``name`` may not sign in at all.

        A session keeps the grant it signed in with, and ends at its next request once they differ:
        a removed user, a changed password, groups or namespaces (the page learns who it is and where
        it may answer when it signs in)."""
        if name not in self._grants:
            self._grants[name] = self._digest(name)
        return self._grants[name]

    def _digest(self, name: str) -> str | None:
        if name not in self.users and name not in self.tokens:
            return None
        entry = [
            self.users.get(name),
            self.tokens.get(name),
            None if self.namespaces is None else sorted(self.namespaces.get(name, ())),
            sorted(group for group, members in self.groups.items() if name in members),
        ]
        return hashlib.sha256(json.dumps(entry).encode()).hexdigest()

    def check_password(self, user: str, password: str) -> bool:
        """One scrypt whether or not ``user`` exists, so timing does not tell which names do."""
        stored = self.users.get(user)
        if stored is None:
            verify_password(password, _UNKNOWN_USER_HASH)
            return False
        return verify_password(password, stored)

    def allowed(self, name: str, served: tuple[str, ...]) -> tuple[str, ...]:
        """The served namespaces that ``name`` may see and answer in, in the served order."""
        if self.namespaces is None:
            return served
        mine = self.namespaces.get(name, ())
        return tuple(namespace for namespace in served if namespace in mine)

    def token_owner(self, token: str) -> str | None:
        owner = None
        for name, known in self.tokens.items():
            if hmac.compare_digest(token.encode(), known.encode()):
                owner = name
        return owner

    def __bool__(self) -> bool:
        return bool(self.users or self.tokens)


class CredentialSource(Protocol):
    """Who may sign in now: ``Credentials`` (fixed) or a ``UsersFile`` (read again when it changes)."""

    def current(self) -> Credentials: ...


def load_credentials(users_file: Path | None, tokens: list[str]) -> Credentials:
    """The credentials of a users file (read once) and ``--token`` flags."""
    data: dict[str, Any] = {}
    if users_file is not None:
        try:
            data = tomllib.loads(users_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"cannot read users file {users_file}: {error}") from error
    return credentials_from(data, str(users_file), tokens)


def credentials_from(data: Mapping[str, Any], source: str, tokens: list[str]) -> Credentials:
    """The credentials a parsed users file (``source`` names it in errors) and ``--token`` flags give."""
    users: dict[str, str] = {}
    named_tokens: dict[str, str] = {}
    namespaces: dict[str, tuple[str, ...]] | None = None
    for section, target in (("users", users), ("tokens", named_tokens)):
        table = data.get(section, {})
        if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
            raise ConfigError(f"{source}: [{section}] maps names to strings")
        target.update(table)
    if "namespaces" in data:
        table = data["namespaces"]
        if not isinstance(table, dict) or not all(
            isinstance(v, list) and all(isinstance(n, str) for n in v) for v in table.values()
        ):
            raise ConfigError(f"{source}: [namespaces] maps names to lists of namespaces")
        namespaces = {name: tuple(v) for name, v in table.items()}
    try:
        groups = load_groups(data, source)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    for spec in tokens:
        name, sep, token = spec.partition("=")
        if not sep or not name or len(token) < 16:
            raise ConfigError("--token takes NAME=TOKEN with a token of at least 16 characters")
        named_tokens[name] = token
    for name, token in named_tokens.items():
        if len(token) < 16:
            raise ConfigError(f"token of {name!r} is shorter than 16 characters")
    return Credentials(users=users, tokens=named_tokens, namespaces=namespaces, groups=groups)


@dataclass(frozen=True, kw_only=True)
class WebConfig:
    redis_url: str = field(repr=False)  # may carry a password
    namespace: str = "default"
    """the primary namespace: it keeps the sessions and throttles (and is served)"""
    also_serve: tuple[str, ...] = ()
    """more namespaces this server provides for (``--serve``), each with its own lease"""
    name: str = "web"
    host: str = "127.0.0.1"
    port: int = 8080
    credentials: CredentialSource = field(default_factory=Credentials)
    """who may sign in: a ``UsersFile`` (``--users-file``, read again when it changes) or fixed ``Credentials``"""
    secure_cookies: bool = False
    session_max_age: float = 12 * 3600
    lease_ttl: float = 10.0
    trusted_proxies: tuple[Network, ...] = ()
    """peers whose X-Forwarded-For is believed (``--trusted-proxy``)"""
    throttle: ThrottleLimits = field(default_factory=ThrottleLimits)
    public_url: str = ""
    """where people reach this server's page (``--public-url``); a standby's page links the holder's"""
    signing_key: str = field(default="", repr=False)
    """the secret key (qbsk1:...) this server signs its answers with, for every namespace it serves"""
    gateway_keys: str = ""
    """the pinned gateway public keys (``--gateway-keys-file``): asks they attest show a verified agent id"""
    policies: Policies = field(default_factory=Policies)
    """quorum and routing policies (``--policy-file``, docs/approvals.md), with the users file's [groups]"""
    slack: SlackConfig | None = None
    """Slack as a face of this provider (``--slack-config``, docs/slack.md); ``None``: no Slack"""
    handover_grace: float = 15.0
    """seconds a holder asked to hand the lease to this server gives a question open there (``--handover-grace``)"""
    page_window: int = 100
    """the cards of each namespace a page is sent at first and kept filled to (``--page-window``);
    the rest are counted and fetched a page at a time"""

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace served, the primary first."""
        return (self.namespace, *(n for n in dict.fromkeys(self.also_serve) if n != self.namespace))
