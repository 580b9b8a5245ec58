"""The fault proxy against a real redis-server: it forwards faithfully, and each fault does what it says."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.exceptions import ConnectionError

from tests.cluster import REDIS_CLI, ClusterProxies, RedisClusterFixture
from tests.faultproxy import FaultProxy, parse_resp
from tests.helpers import next_pending, one_question, pick
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(15)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(redis_server.port) as running:
        yield running


def client(proxy: FaultProxy, **options: object) -> redis.Redis:
    """A plain client through the proxy with no client-side retry, so a fault surfaces."""
    return redis.Redis(port=proxy.port, socket_timeout=5, retry_on_error=[], retry=None, **options)  # type: ignore[arg-type]


def direct(server: RedisServer) -> redis.Redis:
    return redis.Redis(port=server.port, socket_timeout=5)


@pytest.fixture
def raw() -> Iterator[Callable[[FaultProxy], socket.socket]]:
    """Plain sockets to the proxy, closed at teardown."""
    opened: list[socket.socket] = []

    def connect(proxy: FaultProxy) -> socket.socket:
        opened.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=5))
        return opened[-1]

    yield connect
    for sock in opened:
        sock.close()


def test_parse_resp_knows_where_each_value_ends() -> None:
    assert parse_resp(b"+OK\r\n") == (5, b"OK")
    assert parse_resp(b"$3\r\nab") is None
    assert parse_resp(b"$-1\r\n") == (5, None)
    assert parse_resp(b"*2\r\n$1\r\na\r\n:1\r\n+x") == (15, [b"a", b"1"])
    assert parse_resp(b"*2\r\n$1\r\na\r\n") is None
    assert parse_resp(b"%1\r\n+k\r\n_\r\n") == (11, [b"k", None])
    assert parse_resp(b">2\r\n+a\r\n+b\r\n") == (12, ("push", [b"a", b"b"]))
    assert parse_resp(b"PING\r\n") == (6, [b"PING"])


def test_it_forwards_commands_pipelines_and_large_values(proxy, redis_server, namespace) -> None:
    c = client(proxy)
    big = b"x" * 3_000_000
    c.set(f"{namespace}:big", big)
    assert c.get(f"{namespace}:big") == big
    pipe = c.pipeline(transaction=False)
    for _ in range(2000):
        pipe.incr(f"{namespace}:n")
    assert pipe.execute()[-1] == 2000
    assert proxy.seen("INCRBY") == 2000  # redis-py sends INCR as INCRBY and proxy.seen(b"set") == 1
    assert proxy.connections == 1 and proxy.open_connections == 1
    c.close()


def test_it_serves_a_subprocess(proxy) -> None:
    done = subprocess.run([REDIS_CLI, "-p", str(proxy.port), "PING"], capture_output=True, text=True, timeout=10)
    assert done.stdout.strip() == "PONG"
    assert proxy.seen("PING") == 1


def test_drop_next_reply_loses_a_popped_element_with_the_connection(proxy, redis_server, namespace) -> None:
    key = f"{namespace}:inbox"
    waiter, pusher = client(proxy), direct(redis_server)
    assert waiter.ping()  # commands before the fault still get their replies
    fired = proxy.drop_next_reply(b"BLMPOP", skip_empty=True)
    assert waiter.blmpop(0.2, 1, key, direction="LEFT") is None  # type: ignore[arg-type]  # redis-py types each key as a list; a timed-out read does not use the rule up
    assert not fired.is_set()
    threading.Timer(0.3, lambda: pusher.rpush(key, "notice")).start()
    with pytest.raises(ConnectionError):
        waiter.blmpop(5, 1, key, direction="LEFT")  # type: ignore[arg-type]  # redis-py types each key of *args as a list
    assert fired.wait(1)
    assert pusher.llen(key) == 0  # Redis ran the pop: the notice is gone, as after a real lost reply
    assert waiter.ping()  # a new connection is served
    assert proxy.connections == 2


def test_drop_next_reply_can_name_one_script_by_its_sha(proxy, redis_server, namespace) -> None:
    c = client(proxy)
    one = str(c.script_load("return redis.call('INCR', KEYS[1])"))  # str(): redis-py types a reply T | Awaitable[T]
    other = str(c.script_load("return 'other'"))
    proxy.drop_next_reply(b"EVALSHA", one.encode())
    assert c.evalsha(other, 0) == b"other"  # type: ignore[comparison-overlap]  # redis-py types a script's reply as str
    with pytest.raises(ConnectionError):
        c.evalsha(one, 1, f"{namespace}:ran")
    assert direct(redis_server).get(f"{namespace}:ran") == b"1"  # it ran; only its reply was lost
    assert c.evalsha(one, 1, f"{namespace}:ran") == 2  # type: ignore[comparison-overlap]  # redis-py types a script's reply as str


def test_fail_next_reply_sends_an_error_in_place_of_the_reply_and_keeps_the_connection(
    proxy, redis_server, namespace
) -> None:
    c = client(proxy)
    pipe = c.pipeline(transaction=False)
    for _ in range(2):
        pipe.execute_command("INCR", f"{namespace}:n")
    pipe.get(f"{namespace}:n")
    fired = proxy.fail_next_reply(b"INCR", error="ERR injected")
    first, second, value = pipe.execute(raise_on_error=False)
    assert isinstance(first, redis.ResponseError) and str(first) == "injected"
    assert (second, value) == (2, b"2")  # it ran; the replies after it stay in step
    assert fired.is_set() and proxy.open_connections == 1


def test_a_drop_inside_a_pipeline_delivers_the_replies_before_it(proxy, namespace, raw) -> None:
    sock = raw(proxy)
    proxy.drop_next_reply("GET")
    sock.sendall(b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n")
    received = b""
    with pytest.raises(ConnectionResetError):
        while chunk := sock.recv(100):
            received += chunk
    assert received == b"+PONG\r\n"  # then a reset: no GET reply, no second PONG


def test_reset_sends_a_rst_on_every_open_connection(proxy, raw) -> None:
    socks = [raw(proxy) for _ in range(3)]
    for sock in socks:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100) == b"+PONG\r\n"
    assert proxy.open_connections == 3
    proxy.reset()
    for sock in socks:
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"PING\r\n")
            sock.recv(100)
    assert wait_for(lambda: proxy.open_connections == 0)
    assert client(proxy).ping()


def test_silence_holds_everything_and_keeps_sockets_open_until_heal(proxy, raw) -> None:
    sock = raw(proxy)
    proxy.silence()
    sock.sendall(b"PING\r\n")
    sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        sock.recv(100)  # no reply, and no FIN or RST either: a half-open host
    late = raw(proxy)  # even a new connection is accepted and hears nothing
    late.sendall(b"ECHO hi\r\n")
    late.settimeout(0.3)
    with pytest.raises(TimeoutError):
        late.recv(100)
    proxy.heal()
    sock.settimeout(5)
    late.settimeout(5)
    assert sock.recv(100) == b"+PONG\r\n"  # what was held flows once healed
    assert late.recv(100) == b"$2\r\nhi\r\n"


def test_delay_holds_each_direction(proxy) -> None:
    c = client(proxy)
    c.ping()
    proxy.delay(0.3)
    started = time.monotonic()
    c.ping()
    assert time.monotonic() - started >= 0.55  # 0.3 s on the way there, 0.3 s back
    proxy.heal()
    started = time.monotonic()
    c.ping()
    assert time.monotonic() - started < 0.2


def test_refuse_resets_new_connections_and_spares_open_ones(proxy) -> None:
    open_one = client(proxy)
    open_one.ping()
    proxy.refuse()
    with pytest.raises(ConnectionError):
        client(proxy).ping()
    assert open_one.ping()
    proxy.heal()
    assert client(proxy).ping()


def test_stop_closes_every_connection_and_the_port(redis_server, raw) -> None:
    proxy = FaultProxy(redis_server.port).start()
    sock = raw(proxy)
    proxy.silence()  # even with a silenced, blocked connection, stop() returns
    sock.sendall(b"PING\r\n")
    proxy.stop()
    with contextlib.suppress(ConnectionResetError):  # a RST when it still held unread bytes
        assert sock.recv(100) == b""  # else a FIN
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=1)


def wait_for(condition: object, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


async def test_a_broker_asks_and_answers_through_it(proxy, make_broker) -> None:
    """In-process asyncio clients on both ends: the proxy's loop is its own."""
    asking, answering = await make_broker(url=proxy.url), await make_broker(url=proxy.url)
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question(), timeout=10))
        pending = await next_pending(provider)
        await pending.answer(pick("yes"))
        assert await task == pick("yes")
    assert proxy.seen("EVALSHA") >= 3 and proxy.connections >= 4


def test_it_pairs_resp3_replies_too(proxy, redis_server, namespace) -> None:
    c = client(proxy, protocol=3)
    c.hset(f"{namespace}:h", mapping={"a": "1", "b": "2"})
    assert c.hgetall(f"{namespace}:h") == {b"a": b"1", b"b": b"2"}  # a RESP3 map
    proxy.drop_next_reply("HGETALL")
    with pytest.raises(ConnectionError):
        c.hgetall(f"{namespace}:h")
    assert c.ping()


@pytest.mark.timeout(60)
async def test_a_cluster_client_goes_through_one_proxy_per_node(tmp_path, namespace) -> None:
    cluster = RedisClusterFixture(tmp_path / "cluster").start()
    try:
        with ClusterProxies(cluster) as proxies:
            client = proxies.client(decode_responses=True)
            try:
                keys = [f"{namespace}:{i}" for i in range(30)]  # spread over every master
                for key in keys:
                    await client.set(key, "v")
                assert all(proxy.seen("SET") for proxy in proxies.by_port.values())
                assert sum(proxy.seen("SET") for proxy in proxies.by_port.values()) == 30
                key = keys[0]
                proxy = proxies.of(cluster.port_of_slot(cluster.keyslot(key)))
                fired = proxy.drop_next_reply("GET")
                # RedisCluster re-sends a command whose reply was lost (connection_error_retry_attempts,
                # 3 by default): harmless for GET, a lost element for a blocking pop
                assert await client.get(key) == "v"
                assert fired.is_set() and proxy.seen("GET") == 2
            finally:
                await client.aclose()
    finally:
        cluster.kill()
