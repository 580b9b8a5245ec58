"""One frozen settings object, built once at the process edge from flags and environment.

Precedence: a command-line flag, then the environment variable, then the default.
The library never reads ``os.environ``; only this module does, for the CLI. The flags that build
it (``add_arguments``) and the ``Subparsers`` every command registers with live here too: they
are what all commands share.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:  # the broker (redis-py) loads only when a command opens one: `--help` stays instant
    from broker import Broker

__all__ = [
    "AFTER_THE_COMMAND",
    "BEFORE_THE_COMMAND",
    "ENV_VARS",
    "Settings",
    "Subparsers",
    "add_arguments",
    "redact_url",
]

ENV_VARS: Mapping[str, str] = {
    "redis_url": "QBROKER_REDIS_URL",
    "namespace": "QBROKER_NAMESPACE",
    "lease_ttl": "QBROKER_LEASE_TTL",
    "log_level": "QBROKER_LOG_LEVEL",
    "log_json": "QBROKER_LOG_JSON",
    "signing_key": "QBROKER_SIGNING_KEY",
    "signing_key_file": "QBROKER_SIGNING_KEY_FILE",
    "trusted_keys": "QBROKER_TRUSTED_KEYS",
    "trusted_keys_file": "QBROKER_TRUSTED_KEYS_FILE",
    "gateway_url": "QBROKER_GATEWAY_URL",
    "gateway_token": "QBROKER_GATEWAY_TOKEN",
    "gateway_token_file": "QBROKER_GATEWAY_TOKEN_FILE",
    "gateway_keys": "QBROKER_GATEWAY_KEYS",
    "gateway_keys_file": "QBROKER_GATEWAY_KEYS_FILE",
}
_DEFAULTS: Mapping[str, str] = {
    "redis_url": "redis://localhost:6379/0",
    "namespace": "default",
    "lease_ttl": "10",
    "log_level": "WARNING",
    "log_json": "",
    "signing_key": "",
    "signing_key_file": "",
    "trusted_keys": "",
    "trusted_keys_file": "",
    "gateway_url": "",
    "gateway_token": "",
    "gateway_token_file": "",
    "gateway_keys": "",
    "gateway_keys_file": "",
}
_TRUE = {"1", "true", "yes", "on"}


class Subparsers(Protocol):
    """What a command's ``register`` receives: ``ArgumentParser.add_subparsers()``'s result, by what it is used for."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for reprs and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What every sub-command shares: where Redis is, which namespace, how to log."""

    redis_url: str = field(default=_DEFAULTS["redis_url"], repr=False)
    namespace: str = _DEFAULTS["namespace"]
    lease_ttl: float = 10.0
    log_level: str = _DEFAULTS["log_level"]
    log_json: bool = False
    signing_key: str = field(default="", repr=False)
    """the answering side's secret key text (qbsk1:...), '' for none"""
    trusted_keys: str = ""
    """the public key texts (qbpk1:...) answers must be signed by, separated by commas or new lines"""
    gateway_url: str = ""
    """ask through this gateway (http(s)://... or unix:/path) instead of Redis; '' for Redis"""
    gateway_token: str = field(default="", repr=False)
    """the bearer token the gateway knows this agent by"""
    gateway_keys: str = ""
    """the gateways' public keys (qbpk1:...) an answerer pins: asks they attest show a verified agent id"""

    def __repr__(self) -> str:  # the URL may carry a password, and the signing key is a secret
        return (
            f"Settings(redis_url={redact_url(self.redis_url)!r}, namespace={self.namespace!r}, "
            f"lease_ttl={self.lease_ttl!r}, log_level={self.log_level!r}, log_json={self.log_json!r}, "
            f"signing_key={'***' if self.signing_key else ''!r}, trusted_keys={self.trusted_keys!r}, "
            f"gateway_url={self.gateway_url!r}, gateway_token={'***' if self.gateway_token else ''!r}, "
            f"gateway_keys={self.gateway_keys!r})"
        )

    @classmethod
    def build(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
        """Flags win over the environment, which wins over the defaults."""
        env = os.environ if environ is None else environ

        def pick(name: str) -> str:
            flag = getattr(args, name, None)
            if flag is not None:
                return str(flag)
            return env.get(ENV_VARS[name]) or _DEFAULTS[name]

        def key(name: str, what: str) -> str:
            # A file named by a flag wins over the environment's inline key, as flags do.
            inline = "" if getattr(args, f"{name}_file", None) is not None else pick(name)
            return _key_text(inline, pick(f"{name}_file"), what)

        lease_ttl_text = pick("lease_ttl")
        try:
            lease_ttl = float(lease_ttl_text)
        except ValueError:
            raise ValueError(f"lease TTL must be a number of seconds, not {lease_ttl_text!r}") from None
        if lease_ttl <= 0:
            raise ValueError(f"lease TTL must be positive, not {lease_ttl}")
        log_json = getattr(args, "log_json", None)
        return cls(
            redis_url=pick("redis_url"),
            namespace=pick("namespace"),
            lease_ttl=lease_ttl,
            log_level=pick("log_level").upper(),
            log_json=bool(log_json) if log_json is not None else pick("log_json").lower() in _TRUE,
            signing_key=key("signing_key", "signing key"),
            trusted_keys=key("trusted_keys", "trusted keys"),
            gateway_url=pick("gateway_url"),
            gateway_token=key("gateway_token", "gateway token"),
            gateway_keys=key("gateway_keys", "gateway keys"),
        )

    def broker(self, *, namespace: str | None = None, **options: Any) -> Broker:
        """A broker on these settings, with their keys (open it with ``async with``)."""
        from broker import Broker

        return Broker(
            self.redis_url,
            namespace or self.namespace,
            lease_ttl=self.lease_ttl,
            trusted_keys=self.trusted_keys,
            signing_key=self.signing_key or None,
            gateway_keys=self.gateway_keys,
            **options,
        )


def _key_text(text: str, path: str, what: str) -> str:
    """A key given inline or as a file (never both: which one counts would be a guess)."""
    if text and path:
        raise ValueError(f"the {what} is given both inline and as a file ({path}): give one")
    if not path:
        return text.strip()
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except OSError as error:
        raise ValueError(f"cannot read the {what} file {path}: {error.strerror}") from None


AFTER_THE_COMMAND = "connection and logging (also accepted after the sub-command)"
BEFORE_THE_COMMAND = "connection and logging (also accepted before the sub-command)"


def add_arguments(parser: argparse.ArgumentParser, *, suppress: bool = False, title: str = AFTER_THE_COMMAND) -> None:
    """The shared flags; with ``suppress`` an absent flag leaves no attribute, and a flag the parser
    defines already (a sub-command's own) is left to it."""
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group(title)

    def flag(*names: str, **options: Any) -> None:
        try:
            group.add_argument(*names, default=default, **options)
        except argparse.ArgumentError:  # a conflicting option string: the parser has its own flag of that name
            if not suppress:
                raise

    flag(
        "--redis-url",
        metavar="URL",
        help=f"Redis URL, redis:// or rediss:// with credentials (env {ENV_VARS['redis_url']}; "
        f"default {_DEFAULTS['redis_url']})",
    )
    flag(
        "--namespace",
        "-n",
        metavar="NS",
        help=f"namespace: one provider per namespace (env {ENV_VARS['namespace']}; default {_DEFAULTS['namespace']})",
    )
    flag(
        "--lease-ttl",
        metavar="SECONDS",
        help=f"provider lease TTL; a dead holder is replaced after it (env {ENV_VARS['lease_ttl']}; default 10)",
    )
    flag(
        "--log-level",
        metavar="LEVEL",
        help=f"DEBUG, INFO, WARNING or ERROR, logged to stderr (env {ENV_VARS['log_level']}; default WARNING)",
    )
    flag(
        "--signing-key-file",
        metavar="FILE",
        help=f"a provider's secret signing key, made by `qbroker keys new` (env {ENV_VARS['signing_key_file']}, "
        f"or the key itself in {ENV_VARS['signing_key']})",
    )
    flag(
        "--trusted-keys-file",
        metavar="FILE",
        help="the providers' public keys an asker accepts answers from, one a line "
        f"(env {ENV_VARS['trusted_keys_file']}, or the keys themselves in {ENV_VARS['trusted_keys']})",
    )
    flag(
        "--gateway-keys-file",
        metavar="FILE",
        help="an answerer's pinned gateway public keys, one a line: asks they attest show a verified agent id, "
        f"others a claimed one (env {ENV_VARS['gateway_keys_file']}, or the keys in {ENV_VARS['gateway_keys']})",
    )
    flag(
        "--log-json",
        action="store_true",
        help=f"log one JSON object a line (env {ENV_VARS['log_json']}=1)",
    )
