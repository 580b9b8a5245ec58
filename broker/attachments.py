"""Attachments: a text too large for a card (a tool call's whole arguments), kept under its SHA-256.

A question names an attachment by digest (``AskUserQuestionItem.attachment``); the asking side
writes it (``Broker.attach``) and a page reads it (``Broker.attachment``) to show it on request.
An asker may write any attachment, so a reader returns only bytes that hash to the name it
asked for: a card shows exactly the text its question named, or nothing.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from redis.exceptions import RedisError

from ._commands import Commands
from ._keys import Keys
from ._redis_errors import unavailable
from .errors import BAD_REQUEST, UserQuestionError

__all__ = ["MAX_ATTACHMENT_BYTES", "is_digest", "read_attachment", "write_attachment"]

MAX_ATTACHMENT_BYTES: Final = 4 * 1024 * 1024
"""an attachment's UTF-8 size at most: an asker's write is bounded like its requests are"""
_DIGEST: Final = re.compile(r"^[0-9a-f]{64}$")


def is_digest(name: str) -> bool:
    """Whether ``name`` is a SHA-256 as attachments are named: 64 lowercase hex digits."""
    return bool(_DIGEST.match(name))


async def write_attachment(commands: Commands, keys: Keys, text: str, ttl: float) -> str:
    """Keep ``text`` for ``ttl`` seconds under its SHA-256 (hex), which is returned."""
    raw = text.encode()
    if len(raw) > MAX_ATTACHMENT_BYTES:
        raise UserQuestionError(
            f"an attachment holds at most {MAX_ATTACHMENT_BYTES:,} bytes, not {len(raw):,}", BAD_REQUEST
        )
    digest = hashlib.sha256(raw).hexdigest()
    try:
        # Content-addressed: writing it again (a retry, the same call asked twice) stores the same bytes.
        await commands.call("SET", keys.attachment(digest), text, "PX", max(1, int(ttl * 1000)))
    except (RedisError, OSError) as error:
        raise unavailable(error, "attaching a text") from error
    return digest


async def read_attachment(commands: Commands, keys: Keys, digest: str) -> str | None:
    """The text named ``digest``; None when it is gone or its bytes do not hash to ``digest``."""
    if not is_digest(digest):
        raise UserQuestionError("an attachment is named by its SHA-256: 64 lowercase hex digits", BAD_REQUEST)
    try:
        # Undecoded: bytes that are not UTF-8 (an asker may write anything) must not fail the pipeline they share.
        raw = await commands.call("GET", keys.attachment(digest), NEVER_DECODE=True)
    except (RedisError, OSError) as error:
        raise unavailable(error, "reading an attachment") from error
    if not isinstance(raw, bytes) or hashlib.sha256(raw).hexdigest() != digest:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None  # named by its digest, but not a text: nobody attached it through the broker
