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


async def test_status_puts_the_summary_first_and_lists_only_the_oldest_limit(
    make_broker, redis, redis_server, namespace
):
    broker = await make_broker()
    async with broker.provider("desk"):
        tasks = [asyncio.create_task(broker.ask(one_question(), coalesce=False)) for _ in range(3)]
        for _ in range(200):
            if await broker.commands.call("XLEN", broker.keys.requests) == 3:
                break
            await asyncio.sleep(0.02)
        status, out, err = await run_qbroker("status", "--limit", "2", url=redis_server.url, namespace=namespace)
        assert status == 0, err
        lines = out.decode().splitlines()
        listing = next(n for n, line in enumerate(lines) if line.startswith("pending requests: 3, the oldest 2 below"))
        assert lines.index("pending       3 (normal 3)") < listing
        ids = [fields["rid"] for _, fields in await redis.xrange(broker.keys.requests)]
        assert [rid in out.decode() for rid in ids] == [True, True, False]  # the oldest two

        status, out, err = await run_qbroker(
            "status", "--json", "--limit", "1", url=redis_server.url, namespace=namespace
        )
        assert status == 0, err
        data = json.loads(out)
        assert (len(data["pending"]), data["pending_count"], data["pending_by_priority"]) == (1, 3, {"normal": 3})
        assert data["next_after"] == data["pending"][0]["entry"]

        status, out, err = await run_qbroker(
            "status", "--limit", "2", "--after", data["next_after"], url=redis_server.url, namespace=namespace
        )
        assert status == 0, err
        assert [rid in out.decode() for rid in ids] == [False, True, True]  # the page after the first
        assert "next page:" not in out.decode()
        status, _, err = await run_qbroker("status", "--after", "oldest", url=redis_server.url, namespace=namespace)
        assert status == 2 and b"stream entry id" in err
        for task in tasks:
            task.cancel()


async def test_status_says_who_is_alive_the_worker_and_standbys_with_their_time_left(
    make_broker, redis_server, namespace
):
    """Issue "The page a team trusts", row 6: a killed worker was invisible in `qbroker status`."""
    from broker.operating.housekeeping import mark_worker_alive

    holder, spare = await make_broker(), await make_broker()
    standing_by = asyncio.Event()

    async def stand_by() -> None:
        async with spare.provider("spare", on_standby=lambda _holder: standing_by.set()):
            pass

    async with holder.provider("desk"):
        waiting = asyncio.create_task(stand_by())
        await asyncio.wait_for(standing_by.wait(), 5)
        status, out, err = await run_qbroker("status", url=redis_server.url, namespace=namespace)
        assert status == 0, err
        text = out.decode()
        assert "worker        none: the lease holder housekeeps (run `qbroker worker`" in text, text
        assert "standbys      spare (" in text and "s left)" in text, text

        await mark_worker_alive(holder, "worker@host:42", ttl=30)
        status, out, err = await run_qbroker("status", "--json", url=redis_server.url, namespace=namespace)
        data = json.loads(out)
        assert data["worker"] == "worker@host:42" and 0 < data["worker_ttl_s"] <= 30, data
        assert data["standbys"] == ["spare"] and len(data["standby_ttls_s"]) == 1 and data["standby_ttls_s"][0] > 0
        status, out, err = await run_qbroker("status", url=redis_server.url, namespace=namespace)
        assert "worker        worker@host:42 (" in out.decode() and "s left)" in out.decode(), out
        waiting.cancel()


async def test_status_shows_what_askers_wrote_inert(make_broker, redis_server, namespace):
    """An agent id and a key are asker text: escape sequences and bidi overrides show as escapes."""
    broker = await make_broker()
    evil = "\x1b[2J\x1bM\u202e"
    async with broker.provider("desk") as provider, broker.agent("agent" + evil):
        task = asyncio.create_task(broker.ask(one_question(agent="agent" + evil), key="key\u202e"))
        await asyncio.wait_for(anext(aiter(provider)), 5)
        status, out, err = await run_qbroker("status", url=redis_server.url, namespace=namespace)
        assert status == 0, err
        assert b"\x1b" not in out and "\u202e".encode() not in out
        text = out.decode()
        assert "agent\\x1b[2J\\x1bM\\u202e" in text and "key\\u202e" in text
        task.cancel()


async def test_status_lists_the_gateways_alive_and_drops_one_that_stopped(redis_server, namespace, tmp_path):
    """Issue "The page a team trusts", row 6: gateways were invisible in `qbroker status`."""
    from tests.workers.test_gateway import start_gateway
    from workers.asking.gateway.tokens import new_token

    tokens = tmp_path / "tokens"
    new_token(tokens, "ci-bot")
    gateway, _ = await start_gateway(redis_server, namespace, tokens)
    try:
        async with asyncio.timeout(10):
            while True:
                _, out, _ = await run_qbroker("status", "--json", url=redis_server.url, namespace=namespace)
                data = json.loads(out)
                if data["gateways"]:
                    break
                await asyncio.sleep(0.2)
        [name] = data["gateways"]
        assert str(gateway.process.pid) in name and data["gateway_ttls_s"][0] > 0, data
        _, out, _ = await run_qbroker("status", url=redis_server.url, namespace=namespace)
        assert f"gateways      {name} (" in out.decode(), out
    finally:
        assert await gateway.stop() == 0
    _, out, _ = await run_qbroker("status", "--json", url=redis_server.url, namespace=namespace)
    assert json.loads(out)["gateways"] == []  # a clean stop takes it off at once; a killed one lapses
