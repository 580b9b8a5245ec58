"""The broker end to end on a real 3-master Redis Cluster.

The core's integration tests (test_ask, test_provider, test_waterfall, test_durable) run here again with
``make_broker`` and ``redis`` pointing at the cluster: ask/answer, every way out of a wait,
standby takeover, fencing, withdraw, the waterfall and poison entries. Redis Cluster refuses
a script whose keys span slots (CROSSSLOT), so every one of them passing proves that every
script touches one slot. Then namespaces on different masters at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster

from broker import Broker
from broker.connection import redis_from_url
from tests import test_ask, test_durable, test_provider, test_waiting_cost, test_waterfall
from tests.cluster import RedisClusterFixture
from tests.helpers import KEYS, next_pending, one_question, pick
from tests.test_connection import a_killed_read_raises
from tests.test_durable import provider

__all__ = ["provider"]  # the fixture the imported tests use (answering is conftest's)

# The core's scenarios, collected here a second time and run against the cluster.
for _module in (test_ask, test_provider, test_waterfall, test_durable):
    for _name, _test in vars(_module).items():
        if _name.startswith("test_") and callable(_test):
            globals()[_name] = _test
# the sweep's multi-key EXISTS of one namespace's requests, on a cluster
test_only_the_asks_whose_request_is_gone_end_and_within_three_sweeps = (
    test_waiting_cost.test_only_the_asks_whose_request_is_gone_end_and_within_three_sweeps
)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterFixture]:
    cluster = RedisClusterFixture(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.kill()


def cluster_connect(cluster: RedisClusterFixture, name: str | None = None) -> Callable[[], Any]:
    return lambda: redis_from_url(cluster.url, name=name)


@pytest.fixture
async def redis(redis_cluster: RedisClusterFixture) -> AsyncIterator[RedisCluster]:
    client = redis_from_url(redis_cluster.url)
    assert isinstance(client, RedisCluster)
    await client.initialize()  # learn the slot map now (get_node_from_key reads it)
    yield client
    await client.aclose()


@pytest.fixture
def redis_url(redis_cluster: RedisClusterFixture) -> str:
    """``make_broker``'s brokers are on the cluster (the redis+cluster:// URL builds RedisCluster clients)."""
    return redis_cluster.url


def namespaces_on_distinct_masters(cluster: RedisClusterFixture, count: int) -> list[str]:
    """Namespace names whose hash tags land on ``count`` different masters."""
    chosen: dict[int, str] = {}
    for i in range(200):
        name = f"shard-{i}"
        port = cluster.port_of_slot(cluster.keyslot(f"qb:{{{name}}}:requests"))
        chosen.setdefault(port, name)
        if len(chosen) == count:
            return list(chosen.values())
    raise LookupError("could not spread namespaces over the masters")


async def test_a_namespaces_keys_all_live_in_one_slot(make_broker, redis, redis_cluster):
    asking, answering_broker = await make_broker(), await make_broker()
    async with asking.agent("root") as agent, answering_broker.provider("ui") as provider:
        task = asyncio.create_task(agent.ask(one_question()))
        pending = await next_pending(provider)
        await pending.answer(pick("yes"))
        assert await task == pick("yes")
    keys = asking.keys
    slots = {redis_cluster.keyslot(k) for k in (keys.requests, keys.provider, keys.epoch, keys.audit, keys.dead)}
    slots.add(redis_cluster.keyslot(keys.request("x")))
    slots.add(redis_cluster.keyslot(keys.inbox(asking.client_id)))
    assert len(slots) == 1
    [slot] = slots
    node = redis.get_node_from_key(keys.requests)
    assert node.port == redis_cluster.port_of_slot(slot)
    assert await redis.xlen(keys.audit) > 0


async def test_namespaces_on_different_masters_work_at_once(redis_cluster, redis):
    names = namespaces_on_distinct_masters(redis_cluster, 3)
    ports = {redis.get_node_from_key(f"qb:{{{n}}}:requests").port for n in names}
    assert len(ports) == 3  # one namespace per master

    async def round_trip(namespace: str) -> list[Any]:
        async with (
            Broker(redis_cluster.url, namespace, **KEYS) as asking,
            Broker(redis_cluster.url, namespace, **KEYS) as answering_broker,
            answering_broker.provider(f"ui-{namespace}") as provider,
        ):
            asks = [asyncio.create_task(asking.ask(one_question())) for _ in range(10)]
            for _ in asks:
                pending = await next_pending(provider)
                await pending.answer(pick("yes" if namespace == names[0] else "no"), by=namespace)
            return await asyncio.gather(*asks)

    results = await asyncio.gather(*(round_trip(n) for n in names))
    assert results[0] == [pick("yes")] * 10
    assert results[1] == results[2] == [pick("no")] * 10
    for name in names:  # each namespace's audit names only its own answerer
        audit = await redis.xrange(f"qb:{{{name}}}:audit")
        answered = [f for _, f in audit if f["event"] == "answered"]
        assert len(answered) == 10 and {f["by"] for f in answered} == {name}


async def test_a_script_spanning_two_namespaces_is_refused_by_the_cluster(redis, redis_cluster):
    """The guard the suite relies on: a cross-slot script would not pass silently."""
    first, second = namespaces_on_distinct_masters(redis_cluster, 2)
    with pytest.raises(Exception, match=r"CROSSSLOT|same key slot|same slot"):
        await redis.eval("return 1", 2, f"qb:{{{first}}}:provider", f"qb:{{{second}}}:provider")


@pytest.mark.timeout(20)
async def test_a_blocking_cluster_client_never_resends_a_read(redis, redis_cluster):
    """docs/reliability.md: a blocking read lost with its connection is never re-sent, on a Cluster
    client too (which re-sends a command after a connection error unless told not to): its caller
    sees the break and recovers from durable state. A re-sent read would block again instead."""
    key = "{never-resent}:empty"
    node = redis.get_node_from_key(key)
    blocking = redis_from_url(redis_cluster.url, blocking=True)
    killer = Redis(host=node.host, port=node.port, decode_responses=True)
    try:
        await a_killed_read_raises(blocking, killer, key)
    finally:
        await blocking.aclose()
        await killer.aclose()


def test_the_cluster_fixture_is_three_masters(redis_cluster: RedisClusterFixture) -> None:
    info = redis_cluster.cli("CLUSTER", "INFO")
    assert "cluster_state:ok" in info and "cluster_size:3" in info
    assert isinstance(redis_cluster.directory, Path)
