"""Issue 26 item 5: with no maintenance worker alive, the lease holder cleans up after dead askers itself.

Real processes: ``qbroker web`` holds the lease, an asker is killed with SIGKILL, a ``qbroker worker`` runs
(or not) beside them.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broker._keys import Keys
from tests.redis_server import RedisServer, free_port
from tests.workers.procs import Worker
from tests.workers.test_maintenance import start_worker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GRACE = 4.0

ASKER = textwrap.dedent(
    """
    import asyncio, sys
    from broker import Broker
    from tests.helpers import KEYS, one_question

    async def main():
        async with Broker(sys.argv[1], sys.argv[2], agent_ttl=1.0, client_ttl=1.0, **KEYS) as broker:
            async with broker.agent("doomed") as agent:
                plain = asyncio.create_task(agent.ask(one_question()))
                keyed = asyncio.create_task(agent.ask(one_question("a", "b"), key="k1", detach_grace=float(sys.argv[3])))
                print("asked", flush=True)
                await asyncio.gather(plain, keyed)

    asyncio.run(main())
    """
)


async def _web(server: RedisServer, namespace: str) -> Worker:
    web = await Worker.start(
        "web", "--port", str(free_port()), "--token", "bot=0123456789abcdef0123",
        url=server.url, namespace=namespace, QBROKER_WEB_SECRET="s" * 64, QBROKER_LOG_LEVEL="INFO",
    )  # fmt: skip
    await web.expect(r"holds the lease")
    return web


async def _ask_and_die(server: RedisServer, namespace: str, redis: Redis) -> tuple[str, str]:
    """An asker asks one plain and one keyed question, both reach the page, and it is killed: (plain, keyed) ids."""
    keys = Keys(namespace)
    asker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ASKER, server.url, namespace, str(GRACE), cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert asker.stdout is not None
        assert (await asyncio.wait_for(asker.stdout.readline(), 10)).strip() == b"asked"
        async with asyncio.timeout(10):
            while True:
                rids = [f["rid"] for _, f in await redis.xrange(keys.requests) if f.get("kind") == "ask"]
                rows = [await redis.hmget(keys.request(rid), ["delivered", "key"]) for rid in rids]  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
                if len(rids) == 2 and all(delivered for delivered, _ in rows):
                    break
                await asyncio.sleep(0.05)
    finally:
        asker.kill()  # SIGKILL: nothing of the asker runs any more
        await asker.wait()
    keyed = [rid for rid, (_, key) in zip(rids, rows, strict=True) if key]
    plain = [rid for rid in rids if rid not in keyed]
    return plain[0], keyed[0]


async def _state(redis: Redis, keys: Keys, rid: str) -> str | None:
    state: str | None = await redis.hget(keys.request(rid), "state")  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
    return state


async def _provider_runs(redis: Redis, keys: Keys) -> list[dict[str, Any]]:
    runs = await redis.xrange(f"{keys.prefix}maintenance")  # housekeeping.runs_key
    return [fields for _, fields in runs if fields.get("worker", "").startswith("provider:")]


@pytest.mark.timeout(60)
async def test_with_no_worker_the_page_withdraws_and_ends_a_killed_askers_questions(redis_server, namespace, redis):
    keys = Keys(namespace)
    web = await _web(redis_server, namespace)
    try:
        plain, keyed = await _ask_and_die(redis_server, namespace, redis)
        loop = asyncio.get_running_loop()
        # (a Redis started moments ago gives live askers 15 s to beat again before any is judged gone)
        async with asyncio.timeout(30):
            while await redis.zscore(keys.away, keyed) is None:
                assert await _state(redis, keys, keyed) == "pending"
                await asyncio.sleep(0.05)
        away_at = loop.time()
        async with asyncio.timeout(15):
            while await _state(redis, keys, keyed) == "pending":
                await asyncio.sleep(0.05)
        waited = loop.time() - away_at
        assert await _state(redis, keys, keyed) == "expired"
        assert waited >= GRACE - 1.5, f"ended {waited:.1f}s after its asker was found away, not after its grace"
        async with asyncio.timeout(10):
            while await _state(redis, keys, plain) == "pending":
                await asyncio.sleep(0.05)
        assert await _state(redis, keys, plain) == "withdrawn"
        audit = [f for _, f in await redis.xrange(keys.audit)]
        assert {(f["event"], f["by"]) for f in audit if f.get("rid") in (plain, keyed) and "by" in f} >= {
            ("withdrawn", "housekeeping"),
            ("away", "housekeeping"),
            ("expired", "housekeeping"),
        }
        assert await _provider_runs(redis, keys), "the provider recorded no housekeeping run"
        await web.expect(r"no maintenance worker is alive: provider \S+ runs housekeeping")
    finally:
        await web.stop()


@pytest.mark.timeout(60)
async def test_while_a_worker_is_alive_the_page_leaves_housekeeping_to_it(
    redis_server, namespace, redis, tmp_path
) -> None:
    keys = Keys(namespace)
    # A slow worker: its runs are a minute apart, so the provider's would show.
    worker = start_worker(redis_server, namespace, tmp_path / "worker.log", "--interval", "60")
    web: Worker | None = None
    try:
        async with asyncio.timeout(20):
            while not await redis.exists(keys.worker_alive):
                await asyncio.sleep(0.05)
        assert 60_000 < await redis.pttl(keys.worker_alive) <= 180_000  # three intervals
        web = await _web(redis_server, namespace)
        await web.expect(r"a maintenance worker is alive: provider \S+ leaves housekeeping to it")
        await _ask_and_die(redis_server, namespace, redis)
        await asyncio.sleep(8)  # the provider's housekeeping runs every 3 s; the asker's TTLs are 1 s
        assert not [line for line in web.lines if "runs housekeeping" in line], "\n".join(web.lines)
        assert not await _provider_runs(redis, keys)
        # The worker stops: once its marker lapses, the provider takes housekeeping over.
        await redis.pexpire(keys.worker_alive, 1)  # as if three intervals had passed
        worker.process.send_signal(signal.SIGTERM)
        worker.process.wait(timeout=10)
        await web.expect(r"no maintenance worker is alive: provider \S+ runs housekeeping", within=10)
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
        if web is not None:
            await web.stop()
