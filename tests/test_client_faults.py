"""Every ask ends, whatever the network or Redis does (issue 11; docs/reliability.md).

Each test injects one fault against a real redis-server: a reply lost with its connection, a
silent (half-open) connection, a demoted master, Redis out of memory, a lapsed request hash,
a fenced reader, a closed broker. Faults on the wire go through ``tests/faultproxy.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import UserQuestionError
from broker._lua import SCRIPTS
from broker.errors import ASK_TIMED_OUT, BAD_REQUEST, BROKER_UNAVAILABLE
from tests.faultproxy import FaultProxy
from tests.helpers import KEYS, next_pending, one_question, pick
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(45)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as running:
        yield running


async def ends_within(awaitable: Any, seconds: float) -> tuple[Any, float]:
    """Await ``awaitable`` (it must end within ``seconds``); returns (result or error, elapsed)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(seconds):
            result = await awaitable
    except UserQuestionError as error:
        result = error
    return result, time.monotonic() - started


async def wait_until(predicate: Any, seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not await predicate():
            await asyncio.sleep(0.05)


# -- 1, 2: a blocking read's reply lost with its connection --------------------------


async def test_a_notice_lost_with_its_connection_is_recovered_even_when_reconnecting_at_once(proxy, make_broker):
    """The blocking client never re-sends BLMPOP; the broken read leads to catch-up."""
    asking = await make_broker(url=proxy.url, sweep_every=60.0)  # only the catch-up can save it
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question()))  # no timeout of its own
        pending = await next_pending(provider)
        lost = proxy.drop_next_reply(b"BLMPOP", skip_empty=True)
        await pending.answer(pick("yes"))
        assert await asyncio.to_thread(lost.wait, 5)
        result, _ = await ends_within(task, 10)
        assert result == pick("yes")


async def test_an_entry_lost_with_a_broken_provider_read_is_shown(proxy, make_broker):
    asking = await make_broker()
    answering = await make_broker(url=proxy.url, lease_ttl=60.0)  # the periodic reclaim would come too late
    async with answering.provider("ui") as provider:
        await asyncio.sleep(0.3)  # the provider is blocked in XREADGROUP
        lost = proxy.drop_next_reply(b"XREADGROUP", skip_empty=True)
        task = asyncio.create_task(asking.ask(one_question(), timeout=20))
        assert await asyncio.to_thread(lost.wait, 5)
        pending = await next_pending(provider, timeout=10)
        await pending.answer(pick("no"))
        assert await asyncio.wait_for(task, 10) == pick("no")


# -- 3: a fenced reader strands entries; the holder reclaims them ---------------------


async def test_entries_a_fenced_reader_took_are_reclaimed_by_the_new_holder(make_broker, redis: Redis):
    asking = await make_broker()
    fenced_broker = await make_broker(lease_ttl=30.0)  # notices its loss only after 10 s
    holder_broker = await make_broker(lease_ttl=1.0)
    async with fenced_broker.provider("old") as old:
        await asyncio.sleep(0.3)  # blocked in XREADGROUP, as a holder between renewals is
        await redis.delete(asking.keys.provider)  # its lease is gone (lapsed, or lost in a failover)
        async with holder_broker.provider("new") as new:
            await asyncio.sleep(0.3)
            asks = [asyncio.create_task(asking.ask(one_question(), timeout=20)) for _ in range(6)]
            shown = [await next_pending(new, timeout=5) for _ in range(6)]
            for pending in shown:
                await pending.answer(pick("yes"))
            assert await asyncio.gather(*asks) == [pick("yes")] * 6
        assert old.lost


# -- 4: errors classified by class; a background failure never cancels the caller -------


async def test_a_demoted_master_neither_kills_the_broker_nor_cancels_the_caller(redis_factory):
    server, other = redis_factory(), redis_factory()
    from broker import Broker

    async with (
        Broker(server.url, "demote", unavailable_after=3.0, **KEYS) as asking,
        Broker(server.url, "demote", **KEYS) as answering,
    ):
        async with answering.provider("ui") as provider:
            admin = Redis.from_url(server.url)
            try:
                waiting = asyncio.create_task(asking.ask(one_question()))
                pending = await next_pending(provider)
                # Demoted (blocked reads get UNBLOCKED, writes READONLY), then promoted again
                # before the replication delay let it sync: its data is intact.
                await admin.execute_command("REPLICAOF", "127.0.0.1", other.port)
                # An ask sent meanwhile meets READONLY: waited out, not failed.
                during = asyncio.create_task(asking.ask(one_question(), timeout=20))
                await asyncio.sleep(1.0)
                await admin.execute_command("REPLICAOF", "NO", "ONE")
            finally:
                await admin.aclose()
            await pending.answer(pick("no"))
            result, _ = await ends_within(waiting, 10)
            assert result == pick("no")
            await (await next_pending(provider, timeout=10)).answer(pick("yes"))
            result, _ = await ends_within(during, 10)
            assert result == pick("yes")
        # The caller's task was not cancelled and both brokers still work.
        async with answering.provider("ui") as provider:
            task = asyncio.create_task(asking.ask(one_question(), timeout=10))
            await (await next_pending(provider, timeout=10)).answer(pick("yes"))
            assert await task == pick("yes")


async def test_redis_out_of_memory_fails_asks_with_a_code_and_the_broker_recovers(redis_factory):
    server = redis_factory()
    from broker import Broker

    async with (
        Broker(server.url, "oom", unavailable_after=4.0, **KEYS) as asking,
        Broker(server.url, "oom", **KEYS) as answering,
        answering.provider("ui") as provider,
    ):
        admin = Redis.from_url(server.url)
        try:
            await admin.config_set("maxmemory-policy", "noeviction")
            # A second of OOM is waited out: the ask goes through once memory is back.
            await admin.config_set("maxmemory", "1")
            task = asyncio.create_task(asking.ask(one_question(), timeout=20))
            await asyncio.sleep(1.0)
            await admin.config_set("maxmemory", "0")
            await (await next_pending(provider, timeout=10)).answer(pick("no"))
            assert await asyncio.wait_for(task, 10) == pick("no")
            # OOM for longer than unavailable_after: a coded error, within that bound.
            await admin.config_set("maxmemory", "1")
            result, elapsed = await ends_within(asking.ask(one_question(), timeout=30), 15)
            assert isinstance(result, UserQuestionError) and result.code == BROKER_UNAVAILABLE, result
            assert "OutOfMemoryError" in result.message
            assert 3.5 < elapsed < 4.0 + 2.0  # unavailable_after, plus one backoff
            await admin.config_set("maxmemory", "0")
        finally:
            await admin.aclose()
        task = asyncio.create_task(asking.ask(one_question(), timeout=10))
        await (await next_pending(provider, timeout=10)).answer(pick("yes"))
        assert await task == pick("yes")


# -- 5: a silent (half-open) connection -------------------------------------------------


async def test_a_silent_redis_ends_a_waiting_ask_within_the_stated_bound(proxy, make_broker):
    asking = await make_broker(url=proxy.url, unavailable_after=2.0)
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question()))  # no timeout of its own
        await next_pending(provider)
        proxy.silence()
        # Bound: BLMPOP block (2 s) + reply margin (3 s) + unavailable_after, plus one more deadline.
        result, elapsed = await ends_within(task, 15)
        assert isinstance(result, UserQuestionError) and result.code == BROKER_UNAVAILABLE
        assert elapsed < 2.0 + 3.0 + 2.0 + 5.0
        proxy.heal()


async def test_liveness_beats_do_not_wait_on_the_blocking_read(proxy, make_broker, redis: Redis):
    asking = await make_broker(url=proxy.url, client_ttl=1.5)
    await asyncio.sleep(0.2)
    # Beats go on the command connection; silence only new blocking replies by dropping none
    # and holding the inbox read: a BLMPOP blocks for 2 s, longer than a beat interval (0.5 s).
    key = asking.keys.client(asking.client_id)
    ttls = []
    for _ in range(8):
        ttls.append(await redis.pttl(key))
        await asyncio.sleep(0.25)
    assert min(ttls) > 0 and max(ttls) > 1000  # refreshed every 0.5 s, never lapsed


# -- 6: an ask outlives its request hash --------------------------------------------------


async def test_an_ask_whose_request_hash_expired_ends(make_broker, redis: Redis):
    asking = await make_broker(request_ttl=1.0, sweep_every=0.5)
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question()))  # no timeout of its own
        await next_pending(provider)
        result, elapsed = await ends_within(task, 10)
        assert isinstance(result, UserQuestionError) and result.code == ASK_TIMED_OUT, result
        assert elapsed < 1.0 + 3 * 0.5 + 1.0  # request_ttl, then two sweeps that miss it


async def test_deliver_tells_the_asker_when_the_request_hash_is_gone(make_broker, redis: Redis):
    asking = await make_broker(sweep_every=60.0)  # only deliver.lua can end it in time
    answering = await make_broker()
    async with answering.provider("ui"):
        pass  # the group exists; nobody reads now
    await redis.zadd(asking.keys.standbys, {"tok:someone": time.time() * 1000 + 60_000})
    task = asyncio.create_task(asking.ask(one_question()))
    await wait_until(lambda: redis.xlen(asking.keys.requests), 5)
    (_, fields), *_ = await redis.xrange(asking.keys.requests)
    await redis.delete(asking.keys.request(fields["rid"]))  # expired or lost
    async with answering.provider("ui"):
        result, _ = await ends_within(task, 10)
    assert isinstance(result, UserQuestionError) and result.code == BROKER_UNAVAILABLE
    assert await redis.xlen(asking.keys.requests) == 0


# -- 7: closing the broker ends every waiting ask ------------------------------------------


async def test_closing_the_broker_ends_and_withdraws_every_waiting_ask(make_broker):
    asking = await make_broker()
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        tasks = [asyncio.create_task(asking.ask(one_question())) for _ in range(3)]
        shown = [await next_pending(provider) for _ in range(3)]
        await asking.aclose()
        for task in tasks:
            result, _ = await ends_within(task, 5)
            assert isinstance(result, UserQuestionError) and result.code == BROKER_UNAVAILABLE
        for pending in shown:
            await asyncio.wait_for(pending.withdrawn.wait(), 5)


# -- 8: lease_acquire is retry-safe ---------------------------------------------------------


async def test_a_lease_acquisition_whose_reply_was_lost_holds_the_lease(proxy, make_broker, redis: Redis):
    broker = await make_broker(url=proxy.url, lease_ttl=30.0)
    # Cached first: else the dropped reply would be NOSCRIPT and the script would run only once.
    await redis.script_load(SCRIPTS["lease_acquire"].source)
    lost = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["lease_acquire"].sha)
    started = time.monotonic()
    async with asyncio.timeout(10), broker.provider("ui", standby=False) as provider:
        assert await asyncio.to_thread(lost.wait, 1)
        assert not provider.lost
    assert time.monotonic() - started < 5  # it did not stand by behind itself for a TTL


# -- 9: an ask that failed with BROKER_UNAVAILABLE is withdrawn once Redis is back ------------


async def test_an_ask_failed_by_an_outage_is_withdrawn_once_redis_answers(proxy, make_broker, redis: Redis):
    asking = await make_broker(url=proxy.url, unavailable_after=1.5)
    answering = await make_broker()
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question()))
        pending = await next_pending(provider)
        proxy.silence()
        result, _ = await ends_within(task, 15)
        assert isinstance(result, UserQuestionError) and result.code == BROKER_UNAVAILABLE
        proxy.heal()
        await asyncio.wait_for(pending.withdrawn.wait(), 20)  # nobody answers into the void


# -- 12: status reads without SCAN and writes nothing ------------------------------------------


async def test_status_of_a_fresh_namespace_creates_nothing(make_broker, redis: Redis):
    from broker.operating.status import namespace_status

    broker = await make_broker()
    status = await namespace_status(broker)
    assert status.pending == () and status.holder is None
    assert await redis.exists(broker.keys.requests) == 0  # no stream, no group as a side effect


async def test_status_lists_live_agents_from_the_index(make_broker):
    from broker.operating.status import namespace_status

    broker = await make_broker()
    async with broker.agent("root"), broker.agent("child", owner="root"):
        status = await namespace_status(broker)
        assert [(a.agent_id, a.owner) for a in status.agents] == [("child", "root"), ("root", None)]
    assert (await namespace_status(broker)).agents == ()


# -- 13: bad configuration is a coded error, at once ------------------------------------------


async def test_a_database_index_out_of_range_is_a_coded_error_at_once(redis_server):
    from broker import Broker

    result, elapsed = await ends_within(Broker(f"redis://127.0.0.1:{redis_server.port}/99", **KEYS).__aenter__(), 5)
    assert isinstance(result, UserQuestionError) and result.code == BROKER_UNAVAILABLE
    assert elapsed < 1.0  # a refusal, not a wait
    assert "DB index" in result.message


async def test_an_empty_url_parameter_is_a_bad_request():
    from broker.connection import redis_from_url

    with pytest.raises(UserQuestionError) as raised:
        redis_from_url("rediss://127.0.0.1:1/0?ssl_ca_certs=")
    assert raised.value.code == BAD_REQUEST


async def test_an_unreachable_cluster_is_a_coded_error_within_unavailable_after():
    from broker import Broker

    broker = Broker("redis+cluster://127.0.0.1:1", "x", unavailable_after=1.0, **KEYS)
    result, _ = await ends_within(broker.__aenter__(), 10)
    assert isinstance(result, UserQuestionError) and result.code == BROKER_UNAVAILABLE


# -- 15: one client builder, the same timeouts for every scheme --------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:7000/0",
        "rediss://127.0.0.1:7001/0?ssl_cert_reqs=none",
        "redis+sentinel://127.0.0.1:26379/mymaster",
        "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
    ],
    ids=["redis", "rediss", "sentinel", "cluster"],
)
async def test_every_scheme_gets_the_same_timeouts(url):
    from redis.asyncio import RedisCluster

    from broker.connection import COMMAND_TIMEOUT, redis_from_url

    def options(client: Any) -> dict[str, Any]:
        return dict(
            client.connection_kwargs if isinstance(client, RedisCluster) else client.connection_pool.connection_kwargs
        )

    command, blocking = redis_from_url(url), redis_from_url(url, blocking=True)
    try:
        assert options(command)["socket_timeout"] == COMMAND_TIMEOUT
        assert options(blocking)["socket_timeout"] is None
        assert options(blocking)["retry"]._retries == 0  # never re-sent
        if isinstance(blocking, RedisCluster):  # nor by the cluster client after a connection error
            assert blocking.cluster_error_retry_attempts == 0
            assert isinstance(command, RedisCluster) and command.cluster_error_retry_attempts > 0
    finally:
        await command.aclose()
        await blocking.aclose()


# -- 9: an agent's heartbeats refused: not live, never silently "alive" -------------------------


async def test_an_agent_whose_heartbeats_are_refused_stops_being_live(redis_factory):
    """It stopped silently on a ResponseError while ``alive`` stayed True."""
    from broker import Broker
    from broker.errors import CALLER_NOT_LIVE

    server = redis_factory()
    admin = Redis.from_url(server.url)
    try:
        await admin.execute_command("ACL", "SETUSER", "agents", "on", ">pw", "~*", "&*", "+@all")
        url = f"redis://agents:pw@127.0.0.1:{server.port}/0"
        async with Broker(url, "hb", agent_ttl=1.5, **KEYS) as broker, broker.agent("root") as agent:
            await admin.execute_command("ACL", "SETUSER", "agents", "-evalsha", "-eval")  # NOPERM from now on
            await wait_until(lambda: asyncio.sleep(0, result=not agent.alive), 5)
            with pytest.raises(UserQuestionError) as raised:
                await agent.ask(one_question(), timeout=5)
            assert raised.value.code == CALLER_NOT_LIVE
    finally:
        await admin.aclose()


async def test_a_flushed_script_cache_is_refilled_once_not_by_every_waiting_call(make_broker, redis: Redis):
    """After a restart or SCRIPT FLUSH, the first call of a script sends its source (EVAL caches it); the
    calls behind it wait for that one and go by SHA again, rather than each sending the whole source."""
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        await redis.script_flush()
        evals_before = (await redis.info("commandstats")).get("cmdstat_eval", {}).get("calls", 0)
        asks = [asyncio.create_task(asking.ask(one_question("yes", f"no {n}"))) for n in range(40)]
        for _ in asks:
            await (await next_pending(provider)).answer(pick("yes"))
        assert await asyncio.gather(*asks) == [pick("yes")] * 40
        evals = (await redis.info("commandstats")).get("cmdstat_eval", {}).get("calls", 0) - evals_before
    # ask.lua, deliver.lua, settle.lua, settled_cleanup.lua and the like: one EVAL each at the most, not 40
    assert 0 < evals <= 8, evals
