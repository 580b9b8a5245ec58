"""Slack's request signatures (workers/answering/slack/verify.py), against a real redis-server.

Each request is signed the way Slack signs it: ``v0=`` + HMAC-SHA256 of ``v0:<timestamp>:<body>``
with the app's signing secret.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import urlencode

import pytest

from workers.answering.slack.verify import SlackRefused, SlackVerifier

pytestmark = pytest.mark.timeout(20)

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BODY = urlencode({"payload": '{"type":"block_actions","user":{"id":"U1"},"actions":[{"value":"yes"}]}'}).encode()


def signed(body: bytes = BODY, *, secret: str = SECRET, at: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": f"v0={digest}"}


@pytest.fixture
async def verifier(make_broker) -> SlackVerifier:
    broker = await make_broker()
    return SlackVerifier(SECRET, broker.commands.call, broker.keys)


async def refused(verifier: SlackVerifier, body: bytes, headers: dict[str, str]) -> str:
    with pytest.raises(SlackRefused) as raised:
        await verifier.check(body, headers)
    return raised.value.reason


async def test_a_request_signed_like_slack_is_taken_once(verifier) -> None:
    headers = signed()
    await verifier.check(BODY, headers)
    assert (await refused(verifier, BODY, headers)).startswith("replayed")


async def test_the_replay_is_refused_by_another_server_of_the_namespace_too(make_broker) -> None:
    first, second = await make_broker(), await make_broker()
    headers = signed()
    await SlackVerifier(SECRET, first.commands.call, first.keys).check(BODY, headers)
    assert (await refused(SlackVerifier(SECRET, second.commands.call, second.keys), BODY, headers)).startswith(
        "replayed"
    )


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda: (BODY, signed(secret="another app's secret")), "bad signature", id="wrong-secret"),
        pytest.param(lambda: (BODY + b"&x=1", signed()), "bad signature", id="body-changed"),
        pytest.param(lambda: (BODY, signed(at=time.time() - 301)), "stale", id="too-old"),
        pytest.param(lambda: (BODY, signed(at=time.time() + 301)), "stale", id="from-the-future"),
        pytest.param(lambda: (BODY, {}), "unsigned", id="no-headers"),
        pytest.param(
            lambda: (BODY, {**signed(), "X-Slack-Request-Timestamp": "soon"}), "malformed", id="bad-timestamp"
        ),
    ],
)
async def test_a_request_that_is_not_slacks_or_not_fresh_is_refused(verifier, make, reason) -> None:
    body, headers = make()
    assert (await refused(verifier, body, headers)).startswith(reason)


async def test_a_refused_request_does_not_use_up_the_signature(verifier) -> None:
    headers = signed()
    await refused(verifier, BODY + b"tampered", headers)
    await verifier.check(BODY, headers)  # the genuine request still goes through once


def test_the_secret_is_never_in_a_repr(verifier) -> None:
    assert SECRET not in repr(verifier)
