"""The broker through Sentinel: it follows a master failover; what fencing holds across one.

A master, a replica and one sentinel on loopback (``tests/sentinel.py``). The brokers connect
with ``redis+sentinel://127.0.0.1:<sentinel>/qb``. The tests promote the replica with
SENTINEL FAILOVER. Replication is asynchronous, so a failover can lose the last writes of the
old master; the "lossy" tests lose them on purpose (the replica is cut off, the master is
killed) and check what still holds, and mark with strict xfails what the core does not
guarantee yet (see docs/reliability.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ReadOnlyError, ResponseError

from broker import Broker, Provider, UserQuestionError
from broker._lua import SCRIPTS
from tests.helpers import KEYS, code_of, next_pending, one_question, pick
from tests.sentinel import SentinelGroup

pytestmark = pytest.mark.slow


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    # One sentinel: with three, about one run in ten lost the (replicated) lease key on the
    # promoted master during the transition; cause not found in time (see docs/reliability.md).
    group = SentinelGroup(tmp_path).start()
    yield group
    group.kill()


@pytest.fixture
async def make_broker(sentinel_group: SentinelGroup, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    async with AsyncExitStack() as stack:

        async def make(**options: Any) -> Broker:
            # A killed master can hold a retried command (a withdrawal at teardown, say) for the
            # whole unavailable_after: keep that well inside the test's own timeout.
            options.setdefault("unavailable_after", 10.0)
            options.setdefault("housekeeping_every", None)  # as in conftest: tests drive housekeeping themselves
            broker = Broker(sentinel_group.url, namespace, **options, **KEYS)
            return await stack.enter_async_context(broker)

        yield make


def direct(port: int) -> Redis:
    return Redis(host="127.0.0.1", port=port, decode_responses=True)


async def replicated(group: SentinelGroup) -> None:
    """Every write so far is on the replica (WAIT on the master).

    WAIT covers the writes of its own connection only: on a connection that wrote nothing it
    returns at once, whatever the replica lags. That was the "live provider fenced for no
    reason" flake (about one run in five under load): the lease, written by the broker's
    connection a moment before, had not reached the replica that the failover promoted. One
    write here first puts every earlier write of the master under this WAIT.
    """
    client = direct(group.master_port())
    try:
        await client.set("tests:replicated", "1")
        assert await client.execute_command("WAIT", 1, 5000) == 1
    finally:
        await client.aclose()


async def cut_off_the_replica(group: SentinelGroup) -> None:
    """From now on the master's writes do not reach the replica (its resync is refused)."""
    replica = direct(group.replica.port)
    try:
        await replica.config_set("masterauth", "wrong")  # the master has no password: AUTH fails
        await replica.execute_command("CLIENT", "KILL", "TYPE", "master")
        async with asyncio.timeout(10):
            while (await replica.info("replication"))["master_link_status"] != "down":
                await asyncio.sleep(0.02)
    finally:
        await replica.aclose()


async def crash_and_fail_over(group: SentinelGroup) -> None:
    """The master dies with its unreplicated writes; the replica is promoted."""
    group.master.kill()
    await asyncio.to_thread(group.failover)


async def test_the_broker_follows_a_failover(make_broker, sentinel_group):
    asking, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        first = asyncio.create_task(asking.ask(one_question()))
        await (await next_pending(provider)).answer(pick("yes"))
        assert await first == pick("yes")

        waiting = asyncio.create_task(asking.ask(one_question()))
        pending = await next_pending(provider)
        await replicated(sentinel_group)
        new_master = await asyncio.to_thread(sentinel_group.failover)
        assert new_master == sentinel_group.replica.port

        # the provider answers through the new master; the asker's waiter hears it there
        await pending.answer(pick("no"))
        assert await asyncio.wait_for(waiting, 20) == pick("no")
        # and new asks flow through the new master to the same provider
        after = asyncio.create_task(asking.ask(one_question()))
        await (await next_pending(provider, 20)).answer(pick("yes"))
        assert await asyncio.wait_for(after, 20) == pick("yes")
        assert not provider.lost

    client = direct(new_master)
    try:
        audit = await client.xrange(asking.keys.audit)
    finally:
        await client.aclose()
    assert [f["event"] for _, f in audit].count("answered") == 3


@pytest.fixture
async def scenario(make_broker: Callable[..., Any]) -> AsyncIterator[AsyncExitStack]:
    """Providers and tasks of a scenario, closed before their brokers are."""
    async with AsyncExitStack() as stack:
        yield stack


async def _lossy_failover(
    make_broker: Callable[..., Any], group: SentinelGroup, stack: AsyncExitStack, **asking_options: Any
) -> tuple[Provider, Provider, Any, asyncio.Task[Any]]:
    """The old master hands out a lease (epoch e) that the failover loses; a standby takes over.

    Returns (the provider of the lost lease, the one that took over, a pending request the old
    provider still shows, and that request's ask, which the failover lost).
    """
    asking = await make_broker(**asking_options)
    old_broker, new_broker = await make_broker(lease_ttl=1.0), await make_broker()
    async with old_broker.provider("first") as first:
        await replicated(group)
        await cut_off_the_replica(group)
    # released on the master only: the replica still sees "first"'s lease (until it lapses)
    lost = await stack.enter_async_context(old_broker.provider("lost"))
    assert lost.epoch > first.epoch
    task = asyncio.create_task(asking.ask(one_question()))
    stack.push_async_callback(_cancel, task)
    shown = await next_pending(lost)  # shown by the holder of a lease the replica never saw
    await crash_and_fail_over(group)
    taken = await stack.enter_async_context(new_broker.provider("new"))  # after "first"'s lease lapses
    return lost, taken, shown, task


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 15)  # the withdrawal is bounded


async def test_a_lease_lost_in_a_failover_cannot_answer(make_broker, sentinel_group, scenario):
    lost, taken, shown, _ = await _lossy_failover(make_broker, sentinel_group, scenario)
    # the fence is epoch AND a random token: the new holder's lease never matches the lost one
    assert await code_of(shown.answer(pick("yes"))) == "LEASE_LOST"
    assert lost.lost
    # the ask (it reached the new master only if it was replicated: here it was not) is the
    # asker's to retry; the new provider serves new asks
    assert not taken.lost


async def test_an_epoch_lost_in_a_failover_is_never_handed_out_again(make_broker, sentinel_group, scenario):
    lost, taken, _, _ = await _lossy_failover(make_broker, sentinel_group, scenario)
    assert taken.epoch > lost.epoch


async def test_the_broker_survives_blocked_reads_being_unblocked_by_a_demotion(sentinel_group, namespace):
    """READONLY and UNBLOCKED replies are transient (classified by class: redis-py strips their
    code); the old client took ReadOnlyError as permanent, so its reader fenced itself and the
    answer after the switchover got LEASE_LOST about one run in four."""
    async with (
        asyncio.timeout(8),
        Broker(sentinel_group.url, namespace, **KEYS) as asking,
        Broker(sentinel_group.url, namespace, **KEYS) as answering,
        answering.provider("ui") as provider,
    ):
        waiting = asyncio.create_task(asking.ask(one_question()))
        pending = await next_pending(provider)
        await replicated(sentinel_group)
        await asyncio.to_thread(sentinel_group.failover, kill_clients=False)
        await pending.answer(pick("yes"))
        assert await asyncio.wait_for(waiting, 5) == pick("yes")


async def test_an_ask_lost_in_a_failover_fails_rather_than_hangs(make_broker, sentinel_group, scenario):
    """The failover lost the request: the asker's sweep finds neither it nor an outcome twice in
    a row (once could be a server still switching roles) and ends the ask with a coded error."""
    _, _, _, task = await _lossy_failover(make_broker, sentinel_group, scenario, sweep_every=0.5)
    with pytest.raises(UserQuestionError) as raised:
        await asyncio.wait_for(task, 10)
    assert raised.value.code == "BROKER_UNAVAILABLE"
    assert "gone from Redis" in raised.value.message


WRITE_SCRIPTS = ["ask", "deliver", "settle", "withdraw", "deadletter", "lease_acquire", "lease_renew", "lease_release"]


async def test_a_script_sent_to_a_replica_is_refused_not_answered(sentinel_group):
    """A client that reaches a demoted master (stale sentinel, old pooled connection) must not
    get a decision from it."""
    replica = direct(sentinel_group.replica.port)
    keys = [f"qb:{{ns}}:k{i}" for i in range(8)]
    answered = []
    try:
        for name in WRITE_SCRIPTS:
            try:
                await replica.execute_command("EVAL", SCRIPTS[name].source, len(keys), *keys, *["x"] * 11)
                answered.append(name)
            except ReadOnlyError:
                pass
            except ResponseError:
                answered.append(name)  # it ran on the replica and failed in Lua: a decision all the same
    finally:
        await replica.aclose()
    assert answered == []


async def test_min_replicas_serves_and_answers_once_a_replica_has_them(make_broker):
    asking = await make_broker()
    answering = await make_broker(min_replicas=1, replica_timeout=2.0)
    async with answering.provider("ui") as provider:
        task = asyncio.create_task(asking.ask(one_question(), timeout=20))
        await (await next_pending(provider)).answer(pick("yes"))
        assert await asyncio.wait_for(task, 10) == pick("yes")


async def test_min_replicas_does_not_serve_while_no_replica_confirms_the_lease(redis_server):
    """A lone server has no replica: a provider asking for one never starts serving."""
    async with Broker(redis_server.url, "lone-min-replicas", min_replicas=1, replica_timeout=0.2, **KEYS) as answering:
        serving = asyncio.create_task(answering.provider("ui").__aenter__())
        await asyncio.sleep(1.0)
        assert not serving.done()  # the lease is never confirmed by a replica: it does not serve
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
