"""Agent identity: the processes of one agent id share its record, a restart supersedes them, and a
Redis restart that outlasts the record's TTL supersedes nobody (issue 26 items 2 and 4)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Agent, AskUserQuestionAnswer, Broker, Provider
from broker.operating.housekeeping import run_housekeeping
from tests.faultproxy import FaultProxy
from tests.helpers import KEYS, code_of, next_pending, one_question, pick

ROOT = Path(__file__).resolve().parents[1]
TTL = 1.5
"""the agent record's and the asking process's liveness TTL in these tests"""


@pytest.fixture
async def answering(make_broker: Any) -> Any:
    broker = await make_broker()
    async with broker.provider("ui") as provider:
        yield provider


# -- several processes, one agent ------------------------------------------------------------


@pytest.mark.timeout(20)
async def test_processes_of_one_agent_ask_at_once_and_the_last_out_removes_its_record(make_broker, answering, redis):
    first_process, second_process = await make_broker(), await make_broker()
    async with first_process.agent("deployer") as first:
        async with second_process.agent("deployer") as second:
            asks = [asyncio.create_task(agent.ask(one_question("yes", "no"))) for agent in (first, second)]
            for _ in asks:
                await (await next_pending(answering)).answer(pick("yes"))
            assert await asyncio.gather(*asks) == [pick("yes")] * 2
        assert first.alive  # the second leaving took only itself out
        task = asyncio.create_task(first.ask(one_question("yes", "no")))
        await (await next_pending(answering)).answer(pick("no"))
        assert await task == pick("no")
    assert await redis.exists(first_process.keys.agent("deployer")) == 0


@pytest.mark.timeout(20)
async def test_a_restarted_agent_supersedes_every_earlier_process_of_its_id(make_broker, answering, redis):
    old_process, other_process, new_process = [await make_broker(agent_ttl=TTL) for _ in range(3)]
    async with old_process.agent("deployer") as old, other_process.agent("deployer") as other:
        waiting = asyncio.create_task(old.ask(one_question("yes", "no")))
        await next_pending(answering)
        async with new_process.agent("deployer", restart=True) as new:
            assert await code_of(other.ask(one_question())) == "CALLER_NOT_LIVE"
            assert other.superseded and not other.alive  # the refused ask tried to revive it: it learnt, not retried
            report = await run_housekeeping(new_process)
            assert len(report.withdrawn) == 1
            assert await code_of(waiting) == "CALLER_NOT_LIVE"
            async with asyncio.timeout(5):  # the superseded processes' heartbeats neither refresh nor re-add them
                while old.alive or other.alive:
                    await asyncio.sleep(0.05)
            fields = await redis.hkeys(new_process.keys.agent("deployer"))
            assert [f for f in fields if f.startswith("p:")] == ["p:" + new.fingerprint]
        assert await redis.exists(new_process.keys.agent("deployer")) == 0  # a superseded one leaving kept it


@pytest.mark.timeout(20)
async def test_joining_under_another_owner_is_another_instance(make_broker, answering):
    broker, other_process = await make_broker(), await make_broker()
    async with (
        broker.agent("parent") as parent,
        broker.agent("child", owner=parent) as child,
        other_process.agent("child") as resumed,  # resumed as a root: a new instance
    ):
        assert await code_of(child.ask(one_question())) == "CALLER_NOT_LIVE"
        task = asyncio.create_task(resumed.ask(one_question("yes", "no")))
        await (await next_pending(answering)).answer(pick("yes"))
        assert await task == pick("yes")


# -- a Redis restart that outlasts the record's TTL ---------------------------------------------


async def _open(url: str, **options: Any) -> Broker:
    broker = Broker(url, "agents", agent_ttl=TTL, client_ttl=TTL, **options, **KEYS)
    await broker.__aenter__()
    return broker


async def _stop_with_data(server: Any) -> None:
    await asyncio.to_thread(server.process.terminate)  # SIGTERM: the AOF is written out on the way down
    await asyncio.to_thread(server.process.wait)


@contextlib.asynccontextmanager
async def _shown_then_stopped(
    server: Any, *, unavailable_after: float
) -> AsyncIterator[tuple[Broker, Provider, Agent, asyncio.Task[AskUserQuestionAnswer]]]:
    """Agent deployer asks (its broker: ``unavailable_after``), provider ui of another broker is shown it, then
    Redis stops with its data: the other broker, the provider, the agent and the ask's task."""
    asking, judging = await _open(server.url, unavailable_after=unavailable_after), await _open(server.url)
    try:
        async with judging.provider("ui", standby=True) as provider, asking.agent("deployer") as agent:
            task = asyncio.create_task(agent.ask(one_question("yes", "no"), timeout=40))
            await next_pending(provider, 10)
            await _stop_with_data(server)
            yield judging, provider, agent, task
    finally:
        await asking.aclose()
        await judging.aclose()


@pytest.mark.timeout(45)
async def test_a_waiting_ask_survives_a_redis_restart_longer_than_the_agent_ttl(redis_factory):
    """Issue 26 item 4: the record expired in the outage and the ask ended CALLER_NOT_LIVE."""
    server = redis_factory("--appendonly", "yes")
    async with _shown_then_stopped(server, unavailable_after=20) as (judging, provider, agent, task):
        await asyncio.sleep(3 * TTL)  # every liveness key's TTL passes: Redis drops them on load
        server.start()
        loop = asyncio.get_running_loop()
        until = loop.time() + 4 * TTL
        while loop.time() < until:  # housekeeping judges the asker while it comes back, and after
            report = await run_housekeeping(judging)
            assert (report.withdrawn, report.away) == ([], [])
            await asyncio.sleep(0.2)
        assert agent.alive and not task.done()
        async with asyncio.timeout(15):
            while not provider.pending:
                await asyncio.sleep(0.05)
        await provider.pending[0].answer(pick("yes"))
        assert await asyncio.wait_for(task, 15) == pick("yes")


@pytest.mark.timeout(30)
async def test_a_live_agent_asks_at_once_after_redis_restarted_without_its_data(redis_factory):
    """Redis came back empty (no persistence, kill -9): the agent's record is gone until its next heartbeat, a
    third of its TTL away (20 s here). An ask meanwhile is not refused CALLER_NOT_LIVE: the gate's refusal of a
    live process puts its record back (as that heartbeat would) and the ask goes on; the agent stays live."""
    server = redis_factory()
    async with _slow_beating(server.url, server.url) as (asking, judging), asking.agent("deployer") as agent:
        await asyncio.to_thread(server.restart)
        async with asyncio.timeout(10):  # both brokers' connections find the new server
            await asking.commands.call("PING")
            await judging.commands.call("PING")
        assert await asking.commands.call("EXISTS", asking.keys.agent("deployer")) == 0  # the fault fired
        async with judging.provider("ui") as provider:
            task = asyncio.create_task(agent.ask(one_question("yes", "no"), timeout=20))
            shown = asyncio.ensure_future(next_pending(provider, 10))
            await asyncio.wait([task, shown], timeout=12, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                shown.cancel()
            assert not task.done(), task.exception()  # refused at once before: CALLER_NOT_LIVE
            await (await shown).answer(pick("yes"))
            assert await asyncio.wait_for(task, 10) == pick("yes")
        assert agent.alive


@contextlib.asynccontextmanager
async def _slow_beating(asking_url: str, judging_url: str) -> AsyncIterator[tuple[Broker, Broker]]:
    """An asking broker whose agents and process beat once every 20 s (what Redis lost stays lost while the test
    runs, unless the broker puts it back), and a judging one; both closed at the end."""
    asking = Broker(asking_url, "agents", agent_ttl=60, client_ttl=60, **KEYS)
    await asking.__aenter__()
    judging = await _open(judging_url)
    try:
        yield asking, judging
    finally:
        await asking.aclose()
        await judging.aclose()


@pytest.mark.timeout(30)
async def test_an_ask_queued_in_an_outage_reaches_a_redis_back_empty_behind_its_askers_liveness(redis_factory):
    """The ask waited in the commands' queue while Redis was gone and came back empty. The first pipeline that
    goes through leads with the asking process's liveness key, so a provider's delivery does not find the asker
    gone (before: the ask went first, and a provider quick enough withdrew it, 'the asking process stopped', until
    the process beat again: a third of its TTL, 20 s here). Agentless, so the gate's revival of an agent
    (above) does not put a round trip, and with it the inbox's own beat, before the ask."""
    server = redis_factory()
    with FaultProxy(server.port) as proxy:
        async with _slow_beating(proxy.url, server.url) as (asking, judging):
            watching = Redis(port=server.port, decode_responses=True)
            try:
                proxy.refuse()
                proxy.reset()
                await asyncio.to_thread(server.restart)  # kill -9: back empty
                task = asyncio.create_task(asking.ask(one_question("yes", "no"), timeout=20))
                async with judging.provider("ui") as provider:  # a provider first (else: NO_PROVIDER)
                    seen: list[list[str]] = []
                    async with watching.monitor() as monitor:
                        proxy.heal()
                        async with asyncio.timeout(10):
                            while not seen or seen[-1][:2] != ["XADD", asking.keys.requests]:
                                seen.append((await monitor.next_command())["command"].split())
                    liveness = asking.keys.client(asking.client_id)
                    assert ["SET", liveness] in [words[:2] for words in seen]  # before the ask's XADD, the last seen
                    await (await next_pending(provider, 10)).answer(pick("yes"))
                    assert await asyncio.wait_for(task, 10) == pick("yes")
            finally:
                proxy.heal()
                await watching.aclose()


@pytest.mark.timeout(45)
async def test_a_waiting_ask_ends_broker_unavailable_when_the_outage_outlasts_unavailable_after(redis_factory):
    server = redis_factory("--appendonly", "yes")
    async with _shown_then_stopped(server, unavailable_after=2.0) as (_, _, _, task):
        assert await code_of(asyncio.wait_for(task, 25)) == "BROKER_UNAVAILABLE"
        server.start()


ASKER = textwrap.dedent(
    """
    import asyncio, sys
    from broker import Broker
    from tests.helpers import KEYS, one_question

    async def main():
        async with Broker(sys.argv[1], "agents", agent_ttl=1.5, client_ttl=1.5, **KEYS) as broker:
            async with broker.agent("doomed") as agent:
                task = asyncio.create_task(agent.ask(one_question()))
                print("asked", flush=True)
                await task

    asyncio.run(main())
    """
)


@pytest.mark.timeout(45)
async def test_a_killed_askers_question_is_still_withdrawn_after_a_redis_restart(redis_factory):
    """The grace a restart gives askers to come back ends: a dead asker's questions are withdrawn."""
    server = redis_factory("--appendonly", "yes")
    judging = await _open(server.url)
    asker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ASKER, server.url, cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        async with judging.provider("ui", standby=True) as provider:
            assert asker.stdout is not None
            assert (await asyncio.wait_for(asker.stdout.readline(), 10)).strip() == b"asked"
            shown = await next_pending(provider, 10)
            await _stop_with_data(server)
            asker.kill()  # dies while Redis is down: nothing of it comes back
            await asker.wait()
            await asyncio.sleep(3 * TTL)
            server.start()
            assert (await run_housekeeping(judging)).withdrawn == []  # it may yet come back
            async with asyncio.timeout(15):
                while not (await run_housekeeping(judging)).withdrawn:
                    await asyncio.sleep(0.2)
            await asyncio.wait_for(shown.withdrawn.wait(), 15)
    finally:
        if asker.returncode is None:
            asker.kill()
            await asker.wait()
        await judging.aclose()
