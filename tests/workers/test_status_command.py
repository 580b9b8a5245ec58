"""``qbroker status`` as a process: tables for people, one JSON object with ``--json``."""

from __future__ import annotations

import asyncio
import json

from tests.helpers import one_question
from tests.workers.procs import run_qbroker


async def test_status_shows_holder_pending_and_agents(make_broker, redis_server, namespace):
    broker = await make_broker()
    async with broker.provider("desk") as provider, broker.agent("root-agent"):
        task = asyncio.create_task(broker.ask(one_question(agent="root-agent")))
        pending = await asyncio.wait_for(anext(aiter(provider)), 5)
        status, out, err = await run_qbroker("status", "--json", url=redis_server.url, namespace=namespace)
        assert status == 0, err
        data = json.loads(out)
        assert (data["holder"], data["epoch"], data["namespace"]) == ("desk", provider.epoch, namespace)
        assert [(p["request_id"], p["agent"]) for p in data["pending"]] == [(pending.request_id, "root-agent")]
        assert [(a["agent_id"], a["owner"]) for a in data["agents"]] == [("root-agent", None)]

        status, out, err = await run_qbroker("status", url=redis_server.url, namespace=namespace)
        assert status == 0, err
        text = out.decode()
        assert f"desk (epoch {provider.epoch}" in text
        assert pending.request_id in text and "root-agent" in text
        assert "pending requests: 1" in text and "live agents: 1" in text
        task.cancel()


async def test_status_without_redis_exits_broker_unavailable(namespace):
    status, _, err = await run_qbroker("status", url="redis://127.0.0.1:1/0", namespace=namespace)
    assert status == 3 and json.loads(err.splitlines()[-1])["code"] == "BROKER_UNAVAILABLE"
