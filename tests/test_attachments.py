"""Attachments: a text too large for a card, kept content-addressed under its SHA-256 (real redis-server)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionRequest,
    Attachment,
    Limits,
    UserQuestionError,
    check_request,
)
from broker._keys import Keys
from broker.attachments import MAX_ATTACHMENT_BYTES
from broker_adapters._approvals import ToolCall, ask_approvals

pytestmark = pytest.mark.timeout(20)


async def test_an_attachment_is_kept_under_its_digest_for_a_request_ttl(make_broker, redis: Redis, namespace) -> None:
    broker = await make_broker(request_ttl=120.0)
    text = '{"path": "' + "é" * 100_000 + '"}'
    digest = await broker.attach(text)
    assert digest == hashlib.sha256(text.encode()).hexdigest()
    key = Keys(namespace).attachment(digest)
    assert key == f"qb:{{{namespace}}}:att:{digest}"
    assert await redis.get(key) == text
    assert 110_000 < await redis.pttl(key) <= 120_000
    assert await broker.attachment(digest) == text
    assert await broker.attach(text) == digest  # content-addressed: the same text, the same key


async def test_a_gone_or_unknown_attachment_reads_as_none(make_broker) -> None:
    broker = await make_broker()
    assert await broker.attachment("0" * 64) is None


async def test_bytes_that_do_not_hash_to_their_key_are_never_returned(make_broker, redis: Redis, namespace) -> None:
    broker = await make_broker()
    digest = await broker.attach("the text the card named")
    await redis.set(Keys(namespace).attachment(digest), "something else an asker wrote there")
    assert await broker.attachment(digest) is None


async def test_bytes_that_are_not_utf8_read_as_none_and_break_nothing(make_broker, redis: Redis, namespace) -> None:
    broker = await make_broker()
    raw = b"\xff\xfe not a text"
    digest = hashlib.sha256(raw).hexdigest()
    await redis.set(Keys(namespace).attachment(digest), raw)
    assert await broker.attachment(digest) is None
    assert await broker.attachment(await broker.attach("still fine")) == "still fine"


@pytest.mark.parametrize(
    "name", ["x" * 64, "0" * 63, "A" * 64, "../req:1", ""], ids=["hex", "short", "upper", "path", "empty"]
)
async def test_only_a_sha256_names_an_attachment(make_broker, name: str) -> None:
    broker: Any = await make_broker()
    with pytest.raises(UserQuestionError) as raised:
        await broker.attachment(name)
    assert raised.value.code == "BAD_REQUEST"


async def test_an_attachment_over_the_cap_is_refused(make_broker: Callable[..., Any]) -> None:
    broker = await make_broker()
    with pytest.raises(UserQuestionError) as raised:
        await broker.attach("x" * (MAX_ATTACHMENT_BYTES + 1))
    assert raised.value.code == "BAD_REQUEST"
    assert await broker.attach("x" * MAX_ATTACHMENT_BYTES)


async def test_an_agent_attaches_through_its_broker(make_broker) -> None:
    broker = await make_broker()
    async with broker.agent("builder") as agent:
        digest = await agent.attach("whole arguments")
    assert await broker.attachment(digest) == "whole arguments"


@pytest.mark.parametrize(
    ("sha256", "size"), [("x" * 64, 1), ("0" * 64, -1), ("0" * 64, MAX_ATTACHMENT_BYTES + 1)], ids=["hex", "neg", "big"]
)
def test_a_question_names_an_attachment_by_digest_and_size(sha256: str, size: int) -> None:
    item = AskUserQuestionItem(id="q", question="?", attachment=Attachment(sha256=sha256, size=size))
    with pytest.raises(UserQuestionError) as raised:
        check_request(AskUserQuestionRequest(questions=(item,)), Limits())
    assert raised.value.code == "BAD_REQUEST"
    fine = AskUserQuestionItem(id="q", question="?", attachment=Attachment(sha256="0" * 64, size=10))
    check_request(AskUserQuestionRequest(questions=(fine,)), Limits())


class _PlainAsker:
    """An asker that cannot attach (the adapters' ``Asker`` protocol only): it records what it was asked."""

    def __init__(self) -> None:
        self.seen: list[AskUserQuestionRequest] = []

    async def ask(self, request: AskUserQuestionRequest, **options: Any) -> AskUserQuestionAnswer:
        self.seen.append(request)
        return AskUserQuestionAnswer(
            answers=tuple(AskUserQuestionAnswerItem(id=q.id, selected=()) for q in request.questions)
        )


async def test_a_card_names_no_attachment_its_asker_could_not_keep() -> None:
    asker = _PlainAsker()
    await ask_approvals(asker, [ToolCall("c1", "write", {"text": "z" * 70_000})])
    assert asker.seen[0].questions[0].attachment is None
    assert "SHA-256" in (asker.seen[0].questions[0].detail or "")
