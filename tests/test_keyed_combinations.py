"""Keyed asks x housekeeping x min_replicas x provider failover x cancellation x lost replies (issue 23, Proof).

Every part is a real process against a real master and replica: `qbroker worker` (housekeeping every
second), two provider processes (tests/keyed_provider.py, `min_replicas=1`: the first holds the lease and
never answers, the second stands by behind the fault proxy and answers with each question's first option,
remembering it for the namespace), and `qbroker ask --key` processes. Each question's first option is its
own token, so an answer that reached the wrong asker is seen; two agents ask one question (coalesced
onto one card). While the questions are out, askers are killed (SIGKILL), cancelled (SIGTERM, SIGINT:
detached) or paused (SIGSTOP) and run again, the paused one's through the proxy, which drops its
re-attach's reply (the paused process, woken, is still told it was replaced); the first processes'
liveness lapses and their detach grace passes while the new ones wait and housekeeping runs; then the
holder is killed, and the standby's first settle reply is dropped too. Every ask ends with its own answer; 0 lost, 0 answered twice,
0 misrouted, nothing asked twice, no durable key left; a later identical question is answered by the
remembered decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from broker._keys import Keys
from broker._lua import SCRIPTS
from tests.faultproxy import FaultProxy
from tests.helpers import until
from tests.redis_server import FAST_SYNC, RedisServer
from tests.workers.procs import Worker, env_for, run_qbroker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(100)]

GRACE = "3"  # seconds: passes while the restarted askers wait, housekeeping running


@dataclass(frozen=True)
class Asker:
    agent: str
    key: str
    question: str
    token: str

    def command(self) -> tuple[str, ...]:
        return ("ask", "--agent", self.agent, "--key", self.key, "-q", self.question, "-o", self.token,
                "-o", "other", "--detach-grace", GRACE, "--timeout", "80")  # fmt: skip


class Asking:
    """A `qbroker ask` process whose stdout (the answer) and stderr are kept for the end."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.output = asyncio.ensure_future(process.communicate())

    @classmethod
    async def start(cls, asker: Asker, url: str, namespace: str) -> Asking:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers", *asker.command(), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env_for(url, namespace),
        )  # fmt: skip
        return cls(process)

    async def ended(self, within: float) -> tuple[int, str, str]:
        out, err = await asyncio.wait_for(asyncio.shield(self.output), within)
        assert self.process.returncode is not None
        return self.process.returncode, out.decode(), err.decode()

    @staticmethod
    def selected(out: str | bytes) -> list[list[str]]:
        return [item["selected"] for item in json.loads(out)["answers"]]

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await asyncio.gather(self.output, return_exceptions=True)


async def provider(url: str, namespace: str, name: str, delay: float) -> Worker:
    # a 2 s lease: renewed every 0.67 s with a WAIT for the replica, a 1 s one lapsed under a loaded suite (the
    # standby took it before the test began)
    args = (sys.executable, "-m", "tests.keyed_provider", url, namespace, name, str(delay), "2.0", "1", "60")
    process = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=env_for(url, namespace),
    )  # fmt: skip
    return Worker(process)


@contextlib.asynccontextmanager
async def master_and_replica(redis_factory: Callable[..., RedisServer]) -> AsyncIterator[tuple[RedisServer, Redis]]:
    master = redis_factory(*FAST_SYNC)
    replica = redis_factory("--replicaof", "127.0.0.1", str(master.port))
    on_replica = Redis.from_url(replica.url, decode_responses=True)
    redis = Redis.from_url(master.url, decode_responses=True)
    try:
        await until(lambda: _link_up(on_replica), 20, "the replica in sync")
        yield master, redis
    finally:
        await on_replica.aclose()
        await redis.aclose()


async def _link_up(client: Redis) -> bool:
    info = await client.info("replication")
    return info.get("master_link_status") == "up"


async def test_keyed_asks_survive_every_fault_at_once_with_real_processes(redis_factory, namespace):
    keys = Keys(namespace)
    askers = [Asker(f"agent-{i}", f"job-{i}", f"ship build {i}?", f"tok-{i}") for i in range(4)]
    shared = [Asker(f"peer-{i}", f"peer-job-{i}", "ship the shared build?", "tok-shared") for i in range(2)]
    everyone = askers + shared
    workers: list[Worker] = []
    asking: list[Asking] = []

    async def ask(asker: Asker, url: str) -> Asking:
        process = await Asking.start(asker, url, namespace)
        asking.append(process)
        return process

    async with master_and_replica(redis_factory) as (master, redis):
        await redis.script_load(SCRIPTS["ask"].source)  # a re-attach runs as EVALSHA: its reply can be dropped
        with FaultProxy(master.port) as proxy:
            try:
                housekeeping = await Worker.start("worker", "--interval", "1", "--arq-redis-url", master.url,
                                                  "--queue-name", f"arq:{namespace}", url=master.url,
                                                  namespace=namespace)  # fmt: skip
                workers.append(housekeeping)
                holder = await provider(master.url, namespace, "holder", 3600)  # a human who never answers
                workers.append(holder)
                await holder.expect(r"^HOLDING")
                standby = await provider(proxy.url, namespace, "standby", 0.3)
                workers.append(standby)
                await standby.expect(r"^STANDBY")

                first = {asker: await ask(asker, master.url) for asker in everyone}

                async def request_of(asker: Asker) -> str | None:
                    rid: str | None = await redis.get(keys.durable(asker.agent, asker.key))
                    return rid

                async def all_shown() -> bool:
                    for asker in everyone:
                        rid = await request_of(asker)
                        if rid is None or not await redis.hexists(keys.request(rid), "delivered"):  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
                            return False
                    return True

                await until(all_shown, 30, "every question shown to the holder")
                rids = {asker: await request_of(asker) for asker in everyone}
                clients = {asker: await redis.hget(keys.request(str(rids[asker])), "client") for asker in everyone}  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]

                # the askers go: killed, cancelled (detached: exit status 75) or paused, and each runs again
                gone = (*askers, shared[0])
                hows = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP, signal.SIGKILL)
                for asker, how in zip(gone, hows, strict=True):
                    first[asker].process.send_signal(how)
                stopped = [a for a in gone if a is not askers[3]]
                statuses = [(await first[asker].ended(15))[0] for asker in stopped]
                assert statuses == [-9, 75, 75, -9], [(await first[a].ended(1)) for a in stopped]
                lost_attach = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["ask"].sha)
                again = {asker: await ask(asker, proxy.url if asker is askers[3] else master.url) for asker in gone}
                assert await asyncio.to_thread(lost_attach.wait, 20), "the re-attach's reply was never dropped"

                async def all_re_attached() -> bool:
                    for asker in gone:
                        fields = await redis.hmget(keys.request(str(rids[asker])), ["client", "away", "state"])  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
                        if fields[0] in (None, "", clients[asker]) or fields[1] is not None or fields[2] != "pending":
                            return False
                    return True

                await until(all_re_attached, 30, "every restarted asker re-attached to its own request")
                # the paused process wakes: the re-attach whose reply was lost told it that it was replaced
                first[askers[3]].process.send_signal(signal.SIGCONT)
                status, _, err = await first[askers[3]].ended(15)
                assert status == 11 and "CALLER_NOT_LIVE" in err, (status, err)

                # the first processes' liveness lapses (15 s), then their grace passes, housekeeping running:
                # the requests are judged by the processes now asking, never by those that first asked
                async def lapsed() -> bool:
                    return not await redis.exists(*(keys.client(str(clients[a])) for a in gone))

                await until(lapsed, 25, "the first askers' liveness lapsed")
                runs = await redis.xlen(f"{keys.prefix}maintenance")
                await asyncio.sleep(float(GRACE) + 2)
                assert await redis.xlen(f"{keys.prefix}maintenance") > runs, "housekeeping did not run meanwhile"
                states = {a.agent: await redis.hget(keys.request(str(rids[a])), "state") for a in everyone}  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
                assert set(states.values()) == {"pending"}, states  # none ended under its live asker

                # the holder dies; the standby takes over, and its first settle reply is lost
                lost_settle = proxy.drop_next_reply(b"EVALSHA", SCRIPTS["settle"].sha)
                holder.process.kill()
                await standby.expect(r"^HOLDING", within=15)
                ends = {
                    asker: await process.ended(30) for asker, process in [*again.items(), (shared[1], first[shared[1]])]
                }
                assert lost_settle.is_set(), "no settle reply was dropped"
            finally:
                for process in asking:
                    await process.stop()
                for worker in workers:
                    await worker.stop()

        for asker, (status, out, err) in ends.items():
            assert status == 0, (asker, err)
            assert Asking.selected(out) == [[asker.token]], (asker, out)  # its own answer: none misrouted

        audit = [fields for _, fields in await redis.xrange(keys.audit)]
        asklog = [fields for _, fields in await redis.xrange(keys.asklog)]
        answered = Counter(f["rid"] for f in audit if f.get("event") == "answered")
        assert set(answered) == set(rids.values()) and max(answered.values()) == 1, answered  # 0 lost, 0 twice
        asked = Counter(f["agent"] for f in asklog if f.get("event") == "asked")
        assert asked == Counter({a.agent: 1 for a in everyone}), asked  # a restart never asked again
        ended = [f for f in audit if f.get("event") in ("expired", "withdrawn", "cancelled")]
        assert ended == [], ended
        # the answering side never saw an asker away: each detach was followed by its re-attach before any
        # delivery or sweep, and a dead first process never counts once the hash names its successor
        away = [f for f in audit if f.get("event") in ("away", "back")]
        assert away == [], away
        assert await redis.keys(f"{keys.prefix}key:*") == []  # every durable key released once received

        # the answers were remembered: the same question, asked anew, is answered at once without a provider
        status, printed, stderr = await run_qbroker(*askers[0].command(), url=master.url, namespace=namespace)
        assert status == 0 and Asking.selected(printed) == [[askers[0].token]], stderr
        decided = [f for f in await redis.xrange(keys.asklog) if f[1].get("by", "").startswith("decision:")]
        assert len(decided) == 1, decided
