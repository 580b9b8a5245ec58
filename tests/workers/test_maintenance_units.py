"""Fast logic tests of the maintenance worker's pieces: signing, payloads, serialisation, config."""

from __future__ import annotations

import argparse

import msgspec
import pytest

from broker.operating.housekeeping import PendingInfo
from workers.operating.worker.command import config_from_args
from workers.operating.worker.maintenance import MaintenanceConfig, deserialize, serialize
from workers.operating.worker.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, payload, sign, verify

INFO = PendingInfo(
    request_id="r1", agent_id="a<1>", created_ms=1_000_000, deadline_ms=None, delivered=True, questions=("Ship it?",)
)


def test_signature_verifies_and_refuses_tampering_and_replays():
    body = b'{"event":"waiting"}'
    headers = {TIMESTAMP_HEADER: "1000", SIGNATURE_HEADER: sign("s3cret", 1000, body)}
    assert verify("s3cret", headers, body, now=1010)
    assert not verify("other", headers, body, now=1010)
    assert not verify("s3cret", headers, body + b" ", now=1010)
    assert not verify("s3cret", {**headers, TIMESTAMP_HEADER: "1001"}, body, now=1010)
    assert not verify("s3cret", headers, body, now=1000 + 301)  # too old: a replay
    assert not verify("s3cret", {}, body, now=1010)


def test_json_payload():
    body = msgspec.json.decode(payload("waiting", "ns", INFO, now_ms=1_065_000, provider="web", fmt="json"))
    assert body == {
        "event": "waiting",
        "namespace": "ns",
        "requestId": "r1",
        "agent": "a<1>",
        "waitedSeconds": 65,
        "questions": ["Ship it?"],
        "provider": "web",
    }


def test_slack_payload_escapes():
    body = msgspec.json.decode(payload("unattended", "ns", INFO, now_ms=1_000_000, provider=None, fmt="slack"))
    assert "a&lt;1&gt;" in body["text"]
    assert "Ship it?" in body["text"]
    assert body["blocks"][0]["text"]["type"] == "mrkdwn"


def test_job_serialisation_is_msgpack_and_survives_exceptions():
    data = {"t": 1, "f": "deliver_webhook", "a": ["notify", 0, b"{}"], "k": {}, "r": ValueError("boom")}
    raw = serialize(data)
    assert not raw.startswith(b"\x80")  # not a pickle
    back = deserialize(raw)
    assert back["a"] == ["notify", 0, b"{}"]
    assert back["r"] == "ValueError('boom')"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"interval": 7}, id="interval-not-dividing-60"),
        pytest.param({"interval": 0}, id="interval-zero"),
        pytest.param({"attempts": 0}, id="no-attempts"),
        pytest.param({"escalate_after": 10.0}, id="escalation-without-url"),
    ],
)
def test_bad_config_is_refused(options):
    with pytest.raises(ValueError):
        MaintenanceConfig(redis_url="redis://x", **options)


def test_config_flags_win_over_environment_and_secrets_stay_out_of_repr():
    args = argparse.Namespace(interval=2, webhook_url=None, attempts=None, webhook_secret=None)
    env = {
        "QBROKER_REDIS_URL": "redis://:pw@h:1/0",
        "QBROKER_MAINTENANCE_INTERVAL": "5",
        "QBROKER_WEBHOOK_URLS": "http://a/x?token=t1, http://b/y",
        "QBROKER_WEBHOOK_SECRET": "s3cret",
        "QBROKER_WEBHOOK_ATTEMPTS": "3",
    }
    config = config_from_args(args, env)
    assert config.interval == 2
    assert config.attempts == 3
    assert config.webhook_urls == ("http://a/x?token=t1", "http://b/y")
    text = repr(config)
    assert "s3cret" not in text and "pw" not in text and "t1" not in text
