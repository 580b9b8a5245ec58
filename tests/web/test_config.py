"""Credentials from the users file and flags; the ``qbroker web`` parser."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from workers.commands import web as web_command
from workers.web import ConfigError, WebConfig, hash_password, load_credentials, verify_password
from workers.web.auth import SignInThrottle, WebError


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
    config = WebConfig(redis_url="redis://:hunter2@db:6379/0", secret="the-secret")
    assert "hunter2" not in repr(config) and "the-secret" not in repr(config)


def test_command_registers_web(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QBROKER_REDIS_URL", "redis://example:6390/1")
    monkeypatch.setenv("QBROKER_NAMESPACE", "team")
    parser = argparse.ArgumentParser(prog="qbroker")
    web_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["web", "--port", "9000", "--token", "bot=0123456789abcdef"])
    assert (args.command, args.port, args.host) == ("web", 9000, "127.0.0.1")
    assert (args.redis_url, args.namespace, args.token) == ("redis://example:6390/1", "team", ["bot=0123456789abcdef"])
    assert args.func is web_command.run


def test_sign_in_throttle_per_address() -> None:
    now = [0.0]
    throttle = SignInThrottle(limit=3, window=60, clock=lambda: now[0])
    for _ in range(3):
        throttle.check("10.0.0.1")
        throttle.failed("10.0.0.1")
    with pytest.raises(WebError) as caught:
        throttle.check("10.0.0.1")
    assert (caught.value.status, caught.value.code) == (429, "TOO_MANY_ATTEMPTS")
    throttle.check("10.0.0.2")  # another address is not affected
    now[0] = 61.0
    throttle.check("10.0.0.1")  # the window has passed
