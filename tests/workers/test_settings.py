from __future__ import annotations

import argparse

import pytest

from workers.cli import build_parser
from workers.settings import Settings, redact_url


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args([*argv, "ask", "-q", "?"])


def test_defaults():
    settings = Settings.build(_args(), {})
    assert (settings.redis_url, settings.namespace, settings.lease_ttl) == ("redis://localhost:6379/0", "default", 10.0)
    assert (settings.log_level, settings.log_json) == ("WARNING", False)


def test_environment_then_flags_win():
    env = {"QBROKER_REDIS_URL": "redis://env:1/0", "QBROKER_NAMESPACE": "envns", "QBROKER_LEASE_TTL": "2.5",
           "QBROKER_LOG_JSON": "1", "QBROKER_LOG_LEVEL": "info"}  # fmt: skip
    from_env = Settings.build(_args(), env)
    assert (from_env.redis_url, from_env.namespace, from_env.lease_ttl, from_env.log_json, from_env.log_level) == (
        "redis://env:1/0", "envns", 2.5, True, "INFO",
    )  # fmt: skip
    flags = Settings.build(_args("--namespace", "flagns", "--lease-ttl", "1"), env)
    assert (flags.namespace, flags.lease_ttl, flags.redis_url) == ("flagns", 1.0, "redis://env:1/0")


def test_shared_flags_are_accepted_after_the_subcommand_too():
    args = build_parser().parse_args(["--namespace", "before", "ask", "-q", "?", "--lease-ttl", "3"])
    settings = Settings.build(args, {})
    assert (settings.namespace, settings.lease_ttl) == ("before", 3.0)
    args = build_parser().parse_args(["ask", "-q", "?", "--namespace", "after"])
    assert Settings.build(args, {}).namespace == "after"


@pytest.mark.parametrize("value", ["zero", "0", "-1"], ids=["not-a-number", "zero", "negative"])
def test_a_bad_lease_ttl_is_refused(value):
    with pytest.raises(ValueError, match="lease TTL"):
        Settings.build(_args("--lease-ttl", value), {})


def test_the_password_never_shows_in_repr():
    settings = Settings.build(_args("--redis-url", "rediss://user:s3cret@host:6380/1"), {})
    assert "s3cret" not in repr(settings) and "s3cret" not in str(settings)
    assert "rediss://user:***@host:6380/1" in repr(settings)
    assert redact_url("redis://localhost:6379/0") == "redis://localhost:6379/0"
    assert redact_url("redis://:pw@h/0") == "redis://:***@h/0"


def test_settings_are_frozen():
    settings = Settings.build(_args(), {})
    with pytest.raises(AttributeError):
        settings.namespace = "other"  # type: ignore[misc]
