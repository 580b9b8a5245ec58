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

from workers.answering.slack.verify import WINDOW_S, SlackRefused, SlackVerifier
from workers.answering.web.keys import WebKeys

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
    return SlackVerifier(SECRET, broker.commands.call, WebKeys(broker.namespace))


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
    await SlackVerifier(SECRET, first.commands.call, WebKeys(first.namespace)).check(BODY, headers)
    assert (
        await refused(SlackVerifier(SECRET, second.commands.call, WebKeys(second.namespace)), BODY, headers)
    ).startswith("replayed")


@pytest.mark.parametrize(
    "lag_s",
    [pytest.param(0, id="to-the-same-server"), pytest.param(5, id="to-a-server-whose-clock-is-5s-behind")],
)
async def test_a_replay_inside_the_window_is_refused_however_long_after_the_click(make_broker, lag_s) -> None:
    """The longest a captured click stays fresh: taken at the earliest its timestamp allows (a window before
    it, by the taking server's clock), replayed at the last instant a server of the namespace still takes
    that timestamp (a window after it, by that server's clock). Its replay record is aged by the time
    between, as Redis would age it (no minutes of sleep): it must still be there to refuse the replay."""
    broker = await make_broker()
    start = 1_800_000_000.0
    clock = [start]
    taking = SlackVerifier(SECRET, broker.commands.call, WebKeys(broker.namespace), now=lambda: clock[0])
    replayed_to = SlackVerifier(SECRET, broker.commands.call, WebKeys(broker.namespace), now=lambda: clock[0] - lag_s)
    sent = start + WINDOW_S
    headers = signed(at=sent)
    await taking.check(BODY, headers)
    record = broker.keys.prefix + "slack:seen:" + hashlib.sha256(headers["X-Slack-Signature"].encode()).hexdigest()
    lifetime_ms = await broker.commands.call("PTTL", record)
    clock[0] = sent + WINDOW_S + lag_s  # the server it is replayed to reads the window's last instant
    left_ms = lifetime_ms - round((clock[0] - start) * 1000)
    if left_ms > 0:
        await broker.commands.call("PEXPIRE", record, left_ms)
    else:
        await broker.commands.call("DEL", record)  # it ran out before the timestamp did
    assert (await refused(replayed_to, BODY, headers)).startswith("replayed")


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
