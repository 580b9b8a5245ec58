"""A lease holder keeps its lease through a Redis restart shorter than the lease TTL (issue: the page a team
trusts at fleet size, row 2), with real processes and a real ``redis-server`` restarted with AOF."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from broker import Broker
from broker._keys import Keys
from tests.helpers import KEYS, next_pending, one_question, pick
from tests.test_failover_processes import ProviderProcess
from tests.web.conftest import WebProcess, write_users_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(55)]

TTL = 4.0


async def _restart(server, outage: float) -> None:
    await asyncio.to_thread(server.process.terminate)  # a clean shutdown: the AOF has every write
    await asyncio.to_thread(server.process.wait)
    await asyncio.sleep(outage)
    server.start()


async def test_the_page_keeps_its_lease_through_a_redis_restart_shorter_than_the_ttl(redis_factory, tmp_path):
    """The page holds the lease and shows 5 questions, a standby waits; Redis is restarted with AOF and comes
    back after the lease's own expiry but within its TTL. The page keeps the lease (same epoch), the standby
    never holds it, and the page still shows the 5 questions."""
    server = redis_factory("--appendonly", "yes", "--appendfsync", "everysec")
    namespace, keys = "outage", Keys("outage")
    web = WebProcess(server.url, namespace, write_users_file(tmp_path / "users.toml"), tmp_path / "web.log")
    web.extra = ["--lease-ttl", str(TTL), "--token", "ci=ci-token-0123456789abcdef"]
    web.start()
    standby: ProviderProcess | None = None
    asks: list[asyncio.Task[object]] = []
    asker = Broker(server.url, namespace, unavailable_after=60.0, **KEYS)
    await asker.__aenter__()
    try:
        async with asyncio.timeout(10):
            while (held := await asker.commands.call("GET", keys.provider)) is None:
                await asyncio.sleep(0.05)
        standby = ProviderProcess(server.url, namespace, "terminal", "from-terminal", 0.0, TTL)
        await standby.expect("STANDBY")
        asks = [asyncio.create_task(asker.ask(one_question("yes", "no"), timeout=50)) for _ in range(5)]
        headers = {"Authorization": "Bearer ci-token-0123456789abcdef"}
        async with httpx.AsyncClient(base_url=web.url, headers=headers, timeout=5) as page:

            async def shown() -> int:
                return len((await page.get("/api/requests")).json()["requests"])

            async with asyncio.timeout(10):
                while await shown() < 5:
                    await asyncio.sleep(0.1)
            # Restarted when the lease has 2.6-3 s left, back 0.5 s after it lapsed by the clock: under the TTL.
            async with asyncio.timeout(10):
                while not 2600 <= (left := await asker.commands.call("PTTL", keys.provider)) <= 3000:
                    await asyncio.sleep(0.01)
            await _restart(server, left / 1000 + 0.5)
            await asyncio.sleep(2 * TTL)  # long enough for the standby to take a lapsed lease, twice over
            assert await asker.commands.call("GET", keys.provider) == held  # the same holder, the same epoch
            assert not [line for line in standby.lines if line.startswith("HOLDING")]
            assert await shown() == 5
            assert "lost the lease" not in web.log_path.read_text()
        assert not any(ask.done() for ask in asks)
    finally:
        for ask in asks:
            ask.cancel()
        await asyncio.gather(*asks, return_exceptions=True)
        await asker.aclose()
        if standby is not None:
            standby.stop()
        web.stop()


async def test_an_answer_given_during_the_outage_is_taken_once_the_holder_has_its_lease_back(redis_factory):
    """The answer is queued before the holder's next renewal and Redis comes back after the lease lapsed by the
    clock: the renewal goes first (it takes the lease back), so the answer is accepted, not refused LEASE_LOST."""
    server = redis_factory("--appendonly", "yes", "--appendfsync", "everysec")
    asking = Broker(server.url, "outage-answer", unavailable_after=60.0, **KEYS)
    answering = Broker(server.url, "outage-answer", lease_ttl=6.0, unavailable_after=60.0, **KEYS)
    await asking.__aenter__()
    await answering.__aenter__()
    try:
        async with answering.provider("page") as provider:
            asked = asyncio.create_task(asking.ask(one_question("yes", "no"), timeout=50))
            pending = await next_pending(provider)
            async with asyncio.timeout(10):  # the next renewal 0.5-1 s away, the lease 4.5-5 s from lapsing
                while not 4500 <= (left := await answering.commands.call("PTTL", answering.keys.provider)) <= 5000:
                    await asyncio.sleep(0.01)
            await asyncio.to_thread(server.process.terminate)
            await asyncio.to_thread(server.process.wait)
            answered = asyncio.create_task(pending.answer(pick("no")))  # queued before the renewal
            await asyncio.sleep(left / 1000 + 0.5)
            server.start()
            async with asyncio.timeout(20):
                await answered
                assert await asked == pick("no")
            assert not provider.lost
    finally:
        await asking.aclose()
        await answering.aclose()
