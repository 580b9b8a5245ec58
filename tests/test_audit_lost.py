"""An audit Redis lost (a restart without persistence) is told apart from the beginning of the chain.

Each checkpoint names the one its process wrote before (``after``). After Redis restarts without its data,
the first checkpoint of a provider that outlived it names one the audit no longer holds, though the chain
begins afresh: ``verify`` reports the history before it as lost (``qbroker audit verify`` too, as a process).
A fresh namespace, and an audit whose start the cap trimmed, still verify intact.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Broker
from tests.helpers import KEYS, one_question, pick
from tests.redis_server import RedisServer
from tests.test_audit import check, entries, kinds
from tests.workers.procs import run_qbroker

pytestmark = pytest.mark.timeout(40)


async def answer_one(provider_of: Broker, asking: Broker) -> None:
    """One provider block of ``provider_of``: an ask answered; it checkpoints as it takes the lease and stops."""
    async with asyncio.timeout(10), provider_of.provider("p1") as provider:
        asked = asyncio.create_task(asking.ask(one_question()))
        await (await anext(aiter(provider))).answer(pick("yes"), by="alice")
        assert await asked == pick("yes")


async def test_a_redis_restart_without_its_data_is_reported_as_lost_history(
    redis_factory: Callable[..., RedisServer],
) -> None:
    server = redis_factory()
    namespace = f"lost{os.getpid()}"
    async with (
        Broker(server.url, namespace, housekeeping_every=None, **KEYS) as answering,
        Broker(server.url, namespace, **KEYS) as asking,
    ):
        await answer_one(answering, asking)
        before = await check(answering)
        assert before.status == "intact" and before.checkpoints >= 1
        sealed = before.sealed_through

        await asyncio.to_thread(server.restart)  # no persistence: every key is gone
        async with asyncio.timeout(10), answering.provider("p1"):
            pass  # takes the lease: its first checkpoint names its last (the audit is empty otherwise)
        report = await check(answering)
        assert report.status == "broken"
        assert kinds(report) == {("lost", report.first)}
        [finding] = report.findings
        assert "the history before it is gone" in finding.detail and sealed is not None
        assert report.first is not None and report.first > sealed

    status, out, _ = await run_qbroker("audit", "verify", url=server.url, namespace=namespace)
    text = out.decode()
    assert status == 20, text
    assert "(the history before it is gone" in text and f"lost       {report.first}" in text
    assert "(the beginning of the chain)" not in text


async def test_a_fresh_namespace_and_a_trimmed_start_are_not_lost(make_broker: Any, redis: Redis) -> None:
    answering, asking = await make_broker(), await make_broker()
    await answer_one(answering, asking)
    fresh = await check(answering)
    assert fresh.status == "intact" and not fresh.findings
    await answer_one(answering, asking)  # its checkpoints name the first block's last one
    stream = await entries(redis, answering.keys.audit)
    named = [fields["after"] for _, fields in stream if fields.get("after")]
    assert named and all(after in dict(stream) for after in named)
    # The cap trims everything up to the second block's last checkpoint: the one it names is gone too.
    last = max(i for i, (_, fields) in enumerate(stream) if fields.get("after"))
    await redis.xtrim(answering.keys.audit, maxlen=len(stream) - last, approximate=False)
    trimmed = await check(answering)
    assert trimmed.trimmed and not trimmed.findings and trimmed.status == "intact"
