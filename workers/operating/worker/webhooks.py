"""Signed webhook notifications: payloads, the signature, and one delivery attempt.

A receiver verifies a delivery with :func:`verify`: the signature is HMAC-SHA256, keyed by
the shared secret, over ``<timestamp>.<body>``; the timestamp (unix seconds) travels in its
own header so a receiver can refuse old deliveries (replays). ``X-QBroker-Delivery`` is the
same for every attempt of one notification, so a receiver can also drop a repeat.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Literal

import aiohttp
import msgspec

from broker.operating.housekeeping import PendingInfo

__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "Notice",
    "NoticeKind",
    "WebhookFormat",
    "payload",
    "post",
    "sign",
    "verify",
]

TIMESTAMP_HEADER = "X-QBroker-Timestamp"
SIGNATURE_HEADER = "X-QBroker-Signature"
DELIVERY_HEADER = "X-QBroker-Delivery"

WebhookFormat = Literal["json", "slack"]
NoticeKind = Literal["waiting", "unattended", "escalation"]

_HEADLINES: Mapping[str, str] = {
    "waiting": "A question has been waiting for an answer",
    "unattended": "A question is queued and no provider is answering",
    "escalation": "A question is still unanswered",
}


class Notice(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The JSON body of a notification (format ``json``)."""

    event: str
    namespace: str
    request_id: str
    agent: str | None
    waited_seconds: int
    questions: tuple[str, ...]
    provider: str | None
    """the lease holder's name when the notice was made, None when nobody holds it"""


_encoder = msgspec.json.Encoder()


def payload(
    kind: NoticeKind, namespace: str, info: PendingInfo, *, now_ms: int, provider: str | None, fmt: WebhookFormat
) -> bytes:
    """The body to POST, fixed once so that every retry sends the same bytes."""
    notice = Notice(
        event=kind,
        namespace=namespace,
        request_id=info.request_id,
        agent=info.agent_id,
        waited_seconds=max(0, (now_ms - info.created_ms) // 1000),
        questions=info.questions,
        provider=provider,
    )
    if fmt == "json":
        return _encoder.encode(notice)
    lines = "\n".join(f"• {_slack_escape(q)}" for q in info.questions)
    who = f" from agent `{_slack_escape(info.agent_id)}`" if info.agent_id else ""
    text = (
        f"{_HEADLINES[kind]} for {notice.waited_seconds}s in namespace `{_slack_escape(namespace)}`{who} "
        f"(request `{info.request_id}`):\n{lines}"
    )
    return _encoder.encode({"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]})


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>``."""
    digest = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, *, tolerance: float = 300.0, now: float | None = None
) -> bool:
    """True when the delivery is signed with ``secret`` and its timestamp is recent enough."""
    try:
        timestamp = int(headers[TIMESTAMP_HEADER])
        signature = headers[SIGNATURE_HEADER]
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


async def post(
    session: aiohttp.ClientSession, url: str, body: bytes, *, secret: str, delivery_id: str, http_timeout: float = 10.0
) -> int:
    """One signed attempt; returns the HTTP status (raises ``aiohttp.ClientError`` or ``TimeoutError``)."""
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: str(timestamp),
        DELIVERY_HEADER: delivery_id,
        "User-Agent": "qbroker-webhook/1",
    }
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
    async with session.post(
        url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=http_timeout)
    ) as reply:
        await reply.read()
        return reply.status
