"""Credentials from the users file and flags; the ``qbroker web`` parser."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request

from workers.answering.web import command as web_command
from workers.answering.web.config import (
    ConfigError,
    Credentials,
    WebConfig,
    hash_password,
    load_credentials,
    verify_password,
)
from workers.answering.web.throttle import client_address, parse_networks
from workers.cli import build_parser
from workers.settings import Settings


def test_password_hashes_verify() -> None:
    stored = hash_password("s3cret")
    assert verify_password("s3cret", stored)
    assert not verify_password("S3cret", stored)
    assert not verify_password("s3cret", "plain-text")
    assert not verify_password("s3cret", "md5$x$y$z$00$00")


def test_users_file_and_token_flags(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text(f'[users]\nalice = "{hash_password("pw")}"\n[tokens]\nbot = "0123456789abcdef0123"\n')
    credentials = load_credentials(users, ["ci=fedcba9876543210fedc"])
    assert credentials.check_password("alice", "pw")
    assert not credentials.check_password("alice", "nope")
    assert not credentials.check_password("mallory", "pw")
    assert credentials.token_owner("0123456789abcdef0123") == "bot"
    assert credentials.token_owner("fedcba9876543210fedc") == "ci"
    assert credentials.token_owner("0123456789abcdef012") is None
    assert "0123456789abcdef0123" not in repr(credentials)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("[users\n", []), ("[users]\nalice = 3\n", []), ("", ["no-equals-sign"]), ("", ["bot=short"])],
    ids=["bad-toml", "non-string", "token-without-name", "short-token"],
)
def test_bad_configuration_is_refused(tmp_path: Path, text: str, tokens: list[str]) -> None:
    users = tmp_path / "users.toml"
    users.write_text(text)
    with pytest.raises(ConfigError):
        load_credentials(users, tokens)


def test_secrets_stay_out_of_repr() -> None:
    credentials = Credentials(users={"alice": hash_password("pw")}, tokens={"bot": "the-secret-token-123"})
    config = WebConfig(redis_url="redis://:hunter2@db:6379/0", credentials=credentials)
    assert "hunter2" not in repr(config) and "the-secret" not in repr(config) and "scrypt" not in repr(config)


def test_command_registers_web() -> None:
    args = build_parser().parse_args(["web", "--port", "9000", "--token", "bot=0123456789abcdef"])
    assert (args.command, args.port, args.host, args.web_command) == ("web", 9000, "127.0.0.1", None)
    assert args.token == ["bot=0123456789abcdef"]
    assert args.func is web_command.run


def test_web_follows_the_shared_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QBROKER_REDIS_URL", "redis://example:6390/1")
    monkeypatch.setenv("QBROKER_LEASE_TTL", "4")
    parser = build_parser()
    for argv in (["-n", "team", "web"], ["web", "-n", "team"], ["web", "--namespace", "team", "--port", "9000"]):
        args = parser.parse_args(argv)
        settings = Settings.build(args)
        assert (args.func, settings.namespace, settings.lease_ttl) == (web_command.run, "team", 4.0), argv
        assert settings.redis_url == "redis://example:6390/1"
    args = parser.parse_args(
        ["--redis-url", "redis://other:1/0", "web", "sessions", "revoke", "--user", "bob", "-n", "x"]
    )
    settings = Settings.build(args)
    assert (settings.redis_url, settings.namespace) == ("redis://other:1/0", "x")
    assert (args.web_command, args.sessions_command, args.user) == ("sessions", "revoke", "bob")


@pytest.mark.parametrize(
    ("peer", "forwarded", "proxies", "client"),
    [
        ("10.0.0.5", "1.2.3.4", (), "10.0.0.5"),
        ("10.0.0.5", "1.2.3.4", ("10.0.0.0/8",), "1.2.3.4"),
        ("10.0.0.5", "6.6.6.6, 1.2.3.4, 10.0.0.9", ("10.0.0.0/8",), "1.2.3.4"),
        ("192.168.1.1", "1.2.3.4", ("10.0.0.0/8",), "192.168.1.1"),
        ("::1", "2001:db8::1", ("::1",), "2001:db8::1"),
    ],
    ids=["header-ignored-without-proxy", "trusted-proxy", "right-most-untrusted", "untrusted-peer", "ipv6"],
)
def test_client_address_behind_proxies(peer: str, forwarded: str, proxies: tuple[str, ...], client: str) -> None:
    scope = {
        "type": "http",
        "client": (peer, 1234),
        "headers": [(b"x-forwarded-for", forwarded.encode())],
    }
    assert client_address(Request(scope), parse_networks(proxies)) == client


def test_bad_trusted_proxy_is_refused() -> None:
    with pytest.raises(ValueError, match="not-an-ip"):
        parse_networks(["not-an-ip"])


def test_unknown_and_known_users_cost_one_scrypt_each(monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = Credentials(users={"alice": hash_password("alice-password")})
    calls: list[int] = []
    real = hashlib.scrypt

    def counting(*args: Any, **kwargs: Any) -> bytes:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(hashlib, "scrypt", counting)
    assert not credentials.check_password("mallory", "x")
    assert len(calls) == 1
    assert not credentials.check_password("alice", "x")
    assert len(calls) == 2
    assert credentials.check_password("alice", "alice-password")
    assert not credentials.check_password("mallory", "")  # no password matches the stand-in hash


def test_namespaces_per_user(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    users.write_text('[tokens]\nbot = "0123456789abcdef0"\n[namespaces]\nalice = ["a", "b"]\nbot = ["b", "zzz"]\n')
    credentials = load_credentials(users, [])
    served = ("a", "b", "c")
    assert credentials.allowed("alice", served) == ("a", "b")
    assert credentials.allowed("bot", served) == ("b",)  # only what is served, in the served order
    assert credentials.allowed("carol", served) == ()  # not listed: nowhere
    assert Credentials().allowed("carol", served) == served  # no table: everywhere served
    assert WebConfig(redis_url="redis://x", namespace="a", also_serve=("b", "a", "b")).namespaces == ("a", "b")
    users.write_text('[namespaces]\nalice = "a"\n')
    with pytest.raises(ConfigError, match=r"\[namespaces\]"):
        load_credentials(users, [])


@pytest.mark.parametrize("typed", ["\n", "   \n", ""], ids=["empty", "blank", "nothing"])
def test_hashing_an_empty_password_is_refused(typed: str) -> None:
    """Issue 26: `qbroker web --hash-password` hashed an empty password without complaint."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "web", "--hash-password"],
        input=typed, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", done
    assert "empty" in done.stderr


def test_hashing_a_password_prints_its_hash() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "web", "--hash-password"],
        input="correct horse\n", capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and verify_password("correct horse", done.stdout.strip())


def test_a_page_nobody_can_sign_in_to_refuses_to_start(tmp_path: Path) -> None:
    """Issue 26: `qbroker web` with no users and no tokens took the namespace's lease anyway."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "QBROKER_WEB_USERS"}
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "-n", "nobody", "--redis-url", "redis://127.0.0.1:1/0", "web"],
        capture_output=True, text=True, timeout=30, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "NO_USERS" in done.stderr and "--allow-no-users" in done.stderr
    args = build_parser().parse_args(["web", "--allow-no-users"])
    assert args.allow_no_users is True


def test_the_page_runs_without_the_slack_sdk(tmp_path: Path) -> None:
    """`make demo` installs no Slack SDK (an optional extra): the page imported it anyway and died at start."""
    slack = tmp_path / "slack.toml"
    slack.write_text('channel = "C1"\n')
    probe = (
        "import sys\n"
        "sys.modules['slack_sdk'] = None  # as if not installed: importing it raises ImportError\n"
        "from workers.answering.web.app import create_app\n"
        "from workers.cli import main\n"
        f"sys.exit(main(['web', '--allow-no-users', '--slack-config', {str(slack)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--slack-config needs the Slack SDK" in done.stderr
