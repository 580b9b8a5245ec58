"""redis_from_url(): the URL forms, their refusals, and reconnecting through a short outage."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError

from broker import UserQuestionError
from broker._commands import Commands
from broker.connection import SentinelManagedRedis, redis_from_url


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("http://localhost:6379", id="http"),
        pytest.param("localhost:6379", id="no-scheme"),
        pytest.param("redis+nonsense://h:1", id="unknown-plus"),
        pytest.param("redis://h:1?password_in_query=x", id="unknown-param"),
        pytest.param("redis://h:1?ssl_ca_certs=/ca.pem", id="tls-param-without-rediss"),
        pytest.param("rediss://h:1?ssl_cert_reqs=maybe", id="bad-cert-reqs"),
        pytest.param("redis://h:notaport", id="bad-port"),
        pytest.param("redis://h:1,h:2", id="two-hosts-without-cluster"),
        pytest.param("redis://h:1/zero", id="bad-db"),
        pytest.param("redis+cluster://h:1,,h:2", id="empty-host"),
        pytest.param("redis+cluster://h:1/3", id="cluster-with-db"),
        pytest.param("redis+sentinel://h:1", id="sentinel-without-service"),
    ],
)
def test_a_bad_url_is_bad_request(url: str) -> None:
    with pytest.raises(UserQuestionError) as raised:
        redis_from_url(url)
    assert raised.value.code == "BAD_REQUEST"


def test_the_error_never_echoes_the_password() -> None:
    with pytest.raises(UserQuestionError) as raised:
        redis_from_url("redis://user:hunter2@h:1?nope=1")
    assert "hunter2" not in str(raised.value)


async def test_each_scheme_builds_its_client() -> None:
    plain = redis_from_url("redis://alice:s%40cret@127.0.0.1:7000/2", name="qb-x")
    tls = redis_from_url("rediss://127.0.0.1:7001?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required")
    cluster = redis_from_url("redis+cluster://127.0.0.1:7002,127.0.0.1:7003")
    sentinel = redis_from_url("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster/1")
    try:
        assert isinstance(plain, Redis)
        kwargs = plain.connection_pool.connection_kwargs
        assert (kwargs["username"], kwargs["password"], kwargs["db"], kwargs["client_name"]) == (
            "alice",
            "s@cret",
            2,
            "qb-x",
        )
        assert isinstance(tls, Redis)
        assert tls.connection_pool.connection_kwargs["ssl_ca_certs"] == "/ca.pem"
        assert isinstance(cluster, RedisCluster)
        assert {n.port for n in cluster.nodes_manager.startup_nodes.values()} == {7002, 7003}
        assert isinstance(sentinel, SentinelManagedRedis)
        assert sentinel.sentinel_group is not None and len(sentinel.sentinel_group.sentinels) == 2
        assert sentinel.connection_pool.connection_kwargs["db"] == 1
    finally:
        for client in (plain, tls, cluster, sentinel):
            await client.aclose()


async def test_commands_ride_out_a_short_outage(redis_factory) -> None:
    """The client library's own retries are short; the broker's command sender waits the outage out."""
    server = redis_factory()
    client = redis_from_url(server.url)
    commands = Commands(client, give_up_after=10.0)
    sender = asyncio.create_task(commands.run())
    try:
        assert await commands.call("PING") is True
        server.kill()

        async def restart_soon() -> None:
            await asyncio.sleep(1.5)
            await asyncio.to_thread(server.start)

        restarting = asyncio.create_task(restart_soon())
        async with asyncio.timeout(15):
            assert await commands.call("SET", "k", "v") is True
        await restarting
    finally:
        sender.cancel()
        await client.aclose()


async def test_a_caller_cancelled_while_its_command_is_sent_is_cancelled(redis_factory) -> None:
    """Callers only await a future; the sender task alone runs redis-py's socket code, whose
    ``wait_for`` write (Python 3.11) drops a cancellation that lands as the write completes. A
    caller that sent its own command lost about one cancellation in 700 here: an ask cancelled by
    its deadline at that moment would have waited on with no timer left."""
    server = redis_factory()
    client = redis_from_url(server.url)
    commands = Commands(client)
    sender = asyncio.create_task(commands.run())
    try:
        assert await commands.call("PING") is True
        lost = 0
        for turn in range(5000):
            caller = asyncio.create_task(commands.call("GET", "k"))
            for _ in range(turn % 5):
                await asyncio.sleep(0)
            if caller.cancel():
                try:
                    async with asyncio.timeout(5):
                        await caller
                    lost += 1
                except asyncio.CancelledError:
                    pass
        assert lost == 0
    finally:
        sender.cancel()
        await client.aclose()


async def a_killed_read_raises(blocking: Redis | RedisCluster, killer: Redis, key: str) -> None:
    """A BLMPOP on ``key`` through ``blocking``, its connection killed by ``killer`` once Redis shows it blocked:
    it raises ConnectionError. Re-sent (a client's retry on a connection error), it would block again."""
    read = asyncio.create_task(blocking.execute_command("BLMPOP", 5, 1, key, "LEFT"))
    async with asyncio.timeout(5):
        while not any("blmpop" in client["cmd"] for client in await killer.client_list(_type="normal")):
            await asyncio.sleep(0.02)
    assert await killer.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1
    with pytest.raises(ConnectionError):
        async with asyncio.timeout(3):
            await read


async def test_a_blocking_client_never_resends_a_read(redis_factory) -> None:
    """A blocking read broken with its connection raises: its caller must recover from durable state."""
    server = redis_factory()
    blocking = redis_from_url(server.url, blocking=True)
    killer = Redis.from_url(server.url, decode_responses=True)
    try:
        await a_killed_read_raises(blocking, killer, "nothing")
    finally:
        await blocking.aclose()
        await killer.aclose()


async def test_buffered_pipeline_replies_keep_their_order_and_errors(redis_factory) -> None:
    """The command client takes replies already buffered without a timer (broker.connection):
    every reply still goes to its own command, and a Redis error stays that command's error."""
    server = redis_factory()
    client = redis_from_url(f"redis://127.0.0.1:{server.port}/0")
    try:
        await client.set("text", "x")
        pipe = client.pipeline(transaction=False)
        for n in range(300):
            pipe.execute_command("INCRBY", "counter", 1)
            if n % 100 == 50:
                pipe.execute_command("INCR", "text")  # WRONGTYPE-like: not an integer
        results = await pipe.execute(raise_on_error=False)
        numbers = [r for r in results if not isinstance(r, Exception)]
        errors = [r for r in results if isinstance(r, Exception)]
        assert numbers == list(range(1, 301))
        assert len(errors) == 3 and all("not an integer" in str(e) for e in errors)
        assert await client.get("counter") == "300"
    finally:
        await client.aclose()
