"""The Slack face's settings: where each card is posted, and who each Slack user is.

A TOML file (``qbroker web --slack-config slack.toml``)::

    channel = "C0APPROVALS"          # the default channel (an id, or "#name" the bot is in)

    [[route]]                        # the first route that matches a card picks its channel
    channel = "C0PRODOPS"
    namespace = ["prod"]             # each key given must match; globs for namespace and agent
    priority = ["urgent"]
    agent = ["deploy-*"]

The users file (``--users-file``) maps broker users to Slack users, by member id or email::

    [slack]
    alice = "U012ALICE"
    bob = "bob@example.com"          # matched through users.info (scope users:read.email)

A running ``qbroker web`` reads the users file again when it changes: a mapping removed stops that
Slack user at their next click, one added may answer at once.

``socket_mode = true`` takes the clicks over a Socket Mode connection (no public URL) instead of
the request URL.

The bot token, the signing secret and the app-level token come from the environment
(``QBROKER_SLACK_BOT_TOKEN``, ``QBROKER_SLACK_SIGNING_SECRET``, ``QBROKER_SLACK_APP_TOKEN``), never
from a file that might be committed, and never appear in a ``repr``. Socket Mode needs the app-level
token and no signing secret; without one, the request URL takes nothing.
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ChannelRule", "SlackConfig", "SlackConfigError", "load_slack_config", "slack_users"]

_RULE_KEYS = frozenset({"channel", "namespace", "priority", "agent"})
_TOP_KEYS = frozenset({"channel", "route", "api_url", "socket_mode"})


class SlackConfigError(ValueError):
    """The Slack file, its users mapping or its secrets are missing or malformed."""


@dataclass(frozen=True)
class ChannelRule:
    channel: str
    namespace: tuple[str, ...] = ()
    priority: tuple[str, ...] = ()
    agent: tuple[str, ...] = ()

    def matches(self, namespace: str, priority: str, agent: str | None) -> bool:
        if self.namespace and not any(fnmatch.fnmatchcase(namespace, p) for p in self.namespace):
            return False
        if self.priority and priority not in self.priority:
            return False
        return not self.agent or (agent is not None and any(fnmatch.fnmatchcase(agent, p) for p in self.agent))


@dataclass(frozen=True, kw_only=True)
class SlackConfig:
    bot_token: str = field(repr=False)
    signing_secret: str = field(repr=False)
    channel: str
    routes: tuple[ChannelRule, ...] = ()
    api_url: str = "https://slack.com/api/"
    """the Web API's base URL (a test's fake server, or a proxy)"""
    users: Mapping[str, str] = field(default_factory=dict)
    """Slack member id or email (lower case) -> broker user; ``qbroker web`` gives a view of its users
    file that reads the file again when it changed, so each click is judged by the mapping of now"""
    socket_mode: bool = False
    """take the clicks over a Socket Mode connection (authenticated by ``app_token``), not only the request URL"""
    app_token: str = field(default="", repr=False)
    """the app-level token (``xapp-``, scope ``connections:write``) that opens the Socket Mode connection"""

    def channel_for(self, namespace: str, priority: str, agent: str | None) -> str:
        rule = next((r for r in self.routes if r.matches(namespace, priority, agent)), None)
        return rule.channel if rule is not None else self.channel

    def user_of(self, slack_id: str, email: str | None = None) -> str | None:
        """The broker user a Slack user is, or ``None`` (they may not answer)."""
        return self.users.get(slack_id) or (self.users.get(email.lower()) if email else None)

    @property
    def needs_email(self) -> bool:
        return any("@" in key for key in self.users)

    def slack_id_of(self, user: str) -> str | None:
        """A broker user's Slack member id, when the mapping names one (for mentions)."""
        return next((key for key, name in self.users.items() if name == user and "@" not in key), None)


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise SlackConfigError(f"{where}: a string or a list of strings")


def slack_users(data: Mapping[str, Any], source: str) -> dict[str, str]:
    """``[slack]`` of a parsed users file: Slack member id or email (lower case) -> broker user."""
    table = data.get("slack", {})
    if not isinstance(table, dict) or not all(isinstance(v, str) and v for v in table.values()):
        raise SlackConfigError(f"{source}: [slack] maps broker users to a Slack member id or email")
    users: dict[str, str] = {}
    for user, slack in table.items():
        key = slack.lower() if "@" in slack else slack
        if key in users:
            raise SlackConfigError(f"{source}: [slack] gives {slack!r} to both {users[key]} and {user}")
        users[key] = user
    return users


def load_slack_config(
    path: Path,
    users_file: Path | None,
    *,
    bot_token: str,
    signing_secret: str,
    app_token: str = "",
    users: Mapping[str, str] | None = None,
) -> SlackConfig:
    """The Slack settings of ``path``; who each Slack user is from ``users`` when given (a live view),
    else from ``users_file``'s ``[slack]``, read once."""
    try:
        data = tomllib.loads(path.read_text())
        users_data = tomllib.loads(users_file.read_text()) if users_file is not None and users is None else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise SlackConfigError(f"cannot read the Slack settings: {error}") from error
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise SlackConfigError(f"{path}: unknown keys {sorted(unknown)} (known: {sorted(_TOP_KEYS)})")
    socket_mode = data.get("socket_mode", False)
    if not isinstance(socket_mode, bool):
        raise SlackConfigError(f"{path}: socket_mode is true or false")
    if socket_mode and (not bot_token or not app_token):
        raise SlackConfigError(
            "socket_mode needs QBROKER_SLACK_BOT_TOKEN and QBROKER_SLACK_APP_TOKEN (the app-level token) "
            "in the environment"
        )
    if not socket_mode and (not bot_token or not signing_secret):
        raise SlackConfigError(
            "--slack-config needs QBROKER_SLACK_BOT_TOKEN and QBROKER_SLACK_SIGNING_SECRET in the environment"
        )
    channel = data.get("channel")
    if not isinstance(channel, str) or not channel:
        raise SlackConfigError(f"{path}: channel (the default channel) is required")
    routes: list[ChannelRule] = []
    for i, rule in enumerate(data.get("route", [])):
        where = f"{path}: route {i + 1}"
        if not isinstance(rule, dict) or set(rule) - _RULE_KEYS or not isinstance(rule.get("channel"), str):
            raise SlackConfigError(f"{where}: a table with channel and any of namespace, priority, agent")
        routes.append(
            ChannelRule(
                rule["channel"],
                **{
                    key: _strings(rule[key], f"{where}: {key}")
                    for key in ("namespace", "priority", "agent")
                    if key in rule
                },
            )
        )
    if users is None:
        users = slack_users(users_data, str(users_file))
    api_url = data.get("api_url", "https://slack.com/api/")
    if not isinstance(api_url, str) or not api_url.startswith(("http://", "https://")):
        raise SlackConfigError(f"{path}: api_url is an http(s) URL")
    return SlackConfig(
        bot_token=bot_token,
        signing_secret=signing_secret,
        channel=channel,
        routes=tuple(routes),
        api_url=api_url if api_url.endswith("/") else api_url + "/",
        users=users,
        socket_mode=socket_mode,
        app_token=app_token if socket_mode else "",
    )
