"""``qbroker decisions list|revoke`` and ``qbroker ask --no-remember``, as real processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from broker import Broker, Remember
from tests.helpers import one_question, pick
from tests.redis_server import RedisServer
from tests.workers.procs import run_qbroker

pytestmark = pytest.mark.timeout(60)


async def remember_one(broker: Broker) -> None:
    async with broker.provider("ui") as provider:
        asking = asyncio.ensure_future(broker.ask(one_question("yes", "no"), timeout=10))
        await (await anext(aiter(provider))).answer(pick("no"), by="alice", remember=Remember(ttl=600))
        assert await asking == pick("no")


async def test_list_shows_who_set_each_decision_and_revoke_forgets_it(
    make_broker: Callable[..., Any], redis_server: RedisServer, namespace: str
) -> None:
    broker: Broker = await make_broker()
    await remember_one(broker)
    status, out, _ = await run_qbroker("decisions", "list", "--json", url=redis_server.url, namespace=namespace)
    assert status == 0
    [listed] = json.loads(out)
    assert (listed["scope"], listed["by"], listed["provider"], listed["selected"]) == (
        "namespace",
        "alice",
        "ui",
        ["no"],
    )
    assert listed["question"] == "question q1?" and listed["expiresMs"] - listed["atMs"] == 600_000

    status, out, _ = await run_qbroker("decisions", "list", url=redis_server.url, namespace=namespace)
    assert status == 0
    table = out.decode()
    assert listed["id"] in table and "alice via ui" in table and "in 9m" in table and "namespace" in table

    # asked from a shell: answered by the decision at once, no provider needed
    status, out, _ = await run_qbroker("ask", "-q", "question q1?", "-o", "yes", "-o", "no", url=redis_server.url,
                                       namespace=namespace)  # fmt: skip
    assert status == 0 and json.loads(out) == {"answers": [{"id": "q1", "selected": ["no"]}]}
    # --no-remember: a human is needed, and there is none
    status, _, err = await run_qbroker(
        "ask", "-q", "question q1?", "-o", "yes", "-o", "no", "--no-remember", url=redis_server.url,
        namespace=namespace,
    )  # fmt: skip
    assert status == 7 and json.loads(err)["code"] == "NO_PROVIDER"

    args = ("decisions", "revoke", listed["id"], "--by", "bob")
    status, out, _ = await run_qbroker(*args, url=redis_server.url, namespace=namespace)
    assert (status, out.decode().strip()) == (0, f"revoked {listed['id']}")
    status, _, err = await run_qbroker(*args, url=redis_server.url, namespace=namespace)
    assert status == 1 and b"no live decision" in err
    assert await broker.decisions() == []
    status, out, _ = await run_qbroker("decisions", "list", url=redis_server.url, namespace=namespace)
    assert out.decode().strip() == "no remembered decisions"


async def test_revoke_without_an_id_is_a_coded_error(redis_server: RedisServer, namespace: str) -> None:
    status, _, err = await run_qbroker("decisions", "revoke", url=redis_server.url, namespace=namespace)
    assert status == 4 and json.loads(err)["code"] == "BAD_REQUEST"
