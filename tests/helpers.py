"""What the tests share: request builders, waiting on a condition, the next delivered request, an error's code."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionIntent,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PendingRequest,
    PlanReviewIntent,
    Provider,
    SigningKey,
    UserQuestionError,
)
from broker._keys import TOMBSTONE_MS

SIGNING_KEY = (
    SigningKey.from_text(os.environ["QBROKER_SIGNING_KEY"])
    if os.environ.get("QBROKER_SIGNING_KEY")
    else SigningKey.generate()
)
"""the answering side's key in every test; processes the tests start get it from the environment
(tests/conftest.py sets QBROKER_SIGNING_KEY and QBROKER_TRUSTED_KEYS)"""
KEYS: dict[str, Any] = {"signing_key": SIGNING_KEY}
"""Broker keyword arguments: sign as a provider, and trust that key as an asker"""


@contextlib.asynccontextmanager
async def opened_brokers(url: str, namespace: str) -> AsyncIterator[Callable[..., Awaitable[Broker]]]:
    """A maker of open brokers on ``url`` (in ``namespace``, with KEYS, unless told otherwise), closed on exit.

    They run no housekeeping of their own: the tests drive it by hand, and a provider's (it runs one when
    no maintenance worker is alive) would race them, e.g. reaping a poison entry before it is dead-lettered.
    That one is tested in tests/workers/test_self_clean.py."""
    opened: list[Broker] = []

    async def make(**options: Any) -> Broker:
        options.setdefault("namespace", namespace)
        options.setdefault("housekeeping_every", None)
        for name, value in KEYS.items():
            options.setdefault(name, value)
        broker = Broker(options.pop("url", url), **options)
        await broker.__aenter__()
        opened.append(broker)
        return broker

    try:
        yield make
    finally:
        for broker in reversed(opened):
            await broker.aclose()


@contextlib.asynccontextmanager
async def serving(
    broker: Broker, name: str, handle: Callable[[PendingRequest], Awaitable[None]] | None
) -> AsyncIterator[asyncio.Queue[PendingRequest]]:
    """A provider ``name`` in this process: every request delivered is queued, then handed to ``handle``
    (None: left pending)."""
    seen: asyncio.Queue[PendingRequest] = asyncio.Queue()
    async with broker.provider(name) as held:

        async def serve() -> None:
            async for pending in held:
                seen.put_nowait(pending)
                if handle is not None:
                    await handle(pending)

        task = asyncio.create_task(serve())
        try:
            yield seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def options(*labels: str) -> tuple[AskUserQuestionOption, ...]:
    return tuple(AskUserQuestionOption(label=label) for label in labels)


def question(
    qid: str = "q1",
    *labels: str,
    multi: bool = False,
    detail: str | None = None,
    header: str | None = None,
    intent: AskUserQuestionIntent | None = None,
) -> AskUserQuestionItem:
    return AskUserQuestionItem(
        id=qid,
        question=f"question {qid}?",
        detail=detail,
        header=header,
        options=options(*labels) if labels else None,
        multi_select=multi,
        intent=intent,
    )


def one_question(*labels: str, agent: str | None = None) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(questions=(question("q1", *(labels or ("yes", "no"))),), agent=agent)


def plan_review(approve: str = "Approve", *labels: str) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(
        questions=(
            question(
                "plan",
                *(labels or ("Approve", "Refuse")),
                detail="# Plan\n1. do it",
                intent=PlanReviewIntent(approve=approve),
            ),
        )
    )


def answer(*items: tuple[str, tuple[str, ...], str | None]) -> AskUserQuestionAnswer:
    return AskUserQuestionAnswer(
        answers=tuple(AskUserQuestionAnswerItem(id=i, selected=s, custom=c) for i, s, c in items)
    )


def pick(label: str, qid: str = "q1") -> AskUserQuestionAnswer:
    return answer((qid, (label,), None))


async def trail(redis: Any, keys: Any) -> list[dict[str, str]]:
    """The namespace's audit and askers' log together, oldest first; each event says its ``source``."""
    audit = [(i, {**f, "source": "audit"}) for i, f in await redis.xrange(keys.audit)]
    asklog = [(i, {**f, "source": "asker"}) for i, f in await redis.xrange(keys.asklog)]
    return [fields for _, fields in sorted(audit + asklog, key=_when)]


def _when(entry: tuple[str, dict[str, str]]) -> tuple[int, int, int]:
    """Order across the two streams: entry ids of one millisecond say nothing about each other (each
    stream counts its own sequence), so within one the asker's events come first: an asker's ask,
    detach or re-attach is what the answering side's events of that millisecond answer."""
    ms, seq = (int(part) for part in entry[0].split("-", 1))
    return ms, 0 if entry[1]["source"] == "asker" else 1, seq


async def request_residue(redis: Any, namespace: str, *, within: float = 2.0) -> list[str]:
    """Per-request keys left beyond the asker's clean-up: outcome keys, and request hashes that
    still hold their request or outlive the slim tombstone (settled_cleanup.lua).

    Clean-up commands are fired, not awaited, so this waits up to ``within`` seconds for them.
    """
    deadline = asyncio.get_running_loop().time() + within
    while True:
        left = []
        async for key in redis.scan_iter(match=f"qb:{{{namespace}}}:*"):
            if ":ans:" in key or (
                ":req:" in key and (await redis.hexists(key, "request") or await redis.pttl(key) > TOMBSTONE_MS)
            ):
                left.append(key)
        if not left or asyncio.get_running_loop().time() >= deadline:
            return sorted(left)
        await asyncio.sleep(0.05)


async def until(
    predicate: Callable[[], Awaitable[Any] | Any], within: float = 10.0, what: str = "the condition"
) -> None:
    """Wait until ``predicate()`` (a value, or an awaitable of one) is true; fail saying ``what`` after ``within`` s."""
    try:
        async with asyncio.timeout(within):
            while True:
                value = predicate()
                if inspect.isawaitable(value):
                    value = await value
                if value:
                    return
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {within} s: {what}") from None


async def next_pending(provider: Provider, timeout: float = 5) -> PendingRequest:
    """The next request delivered to ``provider``."""
    return await asyncio.wait_for(anext(aiter(provider)), timeout)


async def code_of(awaitable: Awaitable[Any]) -> str:
    """The code of the ``UserQuestionError`` that ``awaitable`` ends with (it must end with one)."""
    with pytest.raises(UserQuestionError) as raised:
        await asyncio.wait_for(awaitable, 10)
    return raised.value.code


async def ends_withdrawn(task: Awaitable[Any], pending: PendingRequest, code: str) -> None:
    """The ask ``task`` ends with ``code``, and the card it was shown as (``pending``) comes down within 5 s."""
    ended = await code_of(task)
    assert ended == code, f"the ask ended {ended}, not {code}"
    await asyncio.wait_for(pending.withdrawn.wait(), 5)


async def cancelled_withdraws(task: asyncio.Future[Any], pending: PendingRequest) -> None:
    """Cancel the ask ``task``: it ends cancelled, and the card it was shown as (``pending``) comes down within 5 s."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(pending.withdrawn.wait(), 5)


def plan_review_arguments(question: str, plan: str, options: tuple[str, ...], approve: str) -> dict[str, Any]:
    """The ask_user_question tool's arguments, as the JSON an agent sends: one plan review, id "plan", whose
    approving option is ``approve`` (it may name none of ``options``: a bad call)."""
    return {
        "questions": [
            {
                "id": "plan",
                "question": question,
                "detail": plan,
                "options": [{"label": label} for label in options],
                "intent": {"kind": "plan-review", "approve": approve},
            }
        ]
    }
