"""The maintenance worker as real processes (arq), against a real redis-server.

Each test spawns ``python -m workers.operating.worker.command`` with a one-second interval and
watches what it does through Redis, a webhook receiver on loopback, and its /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from broker import UserQuestionError
from broker.operating.housekeeping import runs_key
from tests.helpers import one_question, pick
from tests.redis_server import RedisServer, free_port
from workers.operating.worker.webhooks import DELIVERY_HEADER, verify

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SECRET = "test-secret"


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the worker's /metrics (0 when absent)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total


def start_worker(server: RedisServer, namespace: str, log: Path, *flags: str, arq_db: int = 0) -> Worker:
    """`qbroker worker` as a real process on ``server``, its arq queue beside the namespace."""
    port = free_port()
    args = [
        sys.executable, "-m", "workers.operating.worker.command",
        "--redis-url", server.url,
        "--namespace", namespace,
        "--arq-redis-url", f"redis://127.0.0.1:{server.port}/{arq_db}",
        "--queue-name", f"arq:{namespace}",
        "--interval", "1",
        "--metrics-port", str(port),
        *flags,
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    return Worker(process, log, port)


@pytest.fixture
def spawn_worker(redis_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def spawn(*flags: str, arq_db: int = 0) -> Worker:
        worker = start_worker(redis_server, namespace, tmp_path / f"worker{len(workers)}.log", *flags, arq_db=arq_db)
        workers.append(worker)
        return worker

    yield spawn
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()


async def eventually(check: Callable[[], Awaitable[Any]], within: float = 20.0) -> Any:
    """Poll ``check`` until it returns something truthy."""
    async with asyncio.timeout(within):
        while True:
            try:
                value = await check()
            except (OSError, ValueError):  # the metrics server is not up yet
                value = None
            if value:
                return value
            await asyncio.sleep(0.1)


def _metric(worker: Worker, name: str, **labels: str) -> Callable[[], Awaitable[float]]:
    async def read() -> float:
        return await asyncio.to_thread(worker.metric, name, **labels)

    return read


async def _next(provider: Any) -> Any:
    return await asyncio.wait_for(anext(aiter(provider)), 10)


# -- housekeeping -----------------------------------------------------------------------------

ASKER = textwrap.dedent(
    """
    import asyncio, sys
    from broker import Broker
    from tests.helpers import KEYS, one_question

    async def main():
        async with Broker(sys.argv[1], sys.argv[2], agent_ttl=1.0, client_ttl=1.0, **KEYS) as broker:
            async with broker.agent("doomed") as agent:
                tasks = [asyncio.create_task(agent.ask(one_question())) for _ in range(3)]
                print("asked", flush=True)
                await asyncio.gather(*tasks)

    asyncio.run(main())
    """
)


async def test_killed_agent_process_requests_are_withdrawn(spawn_worker, make_broker, redis, redis_server, namespace):
    answering = await make_broker()
    keys = answering.keys
    worker = spawn_worker()
    async with answering.provider("p1") as provider:
        asker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ASKER, redis_server.url, namespace, cwd=ROOT, stdout=subprocess.PIPE
        )
        try:
            assert asker.stdout is not None
            assert (await asyncio.wait_for(asker.stdout.readline(), 10)).strip() == b"asked"
            shown = [await _next(provider) for _ in range(3)]
        finally:
            asker.kill()  # SIGKILL: nothing of the asker runs any more
            await asker.wait()
        for pending in shown:  # the UI is told to take each card down
            await asyncio.wait_for(pending.withdrawn.wait(), 20)
    events = [f for _, f in await redis.xrange(keys.audit) if f.get("event") == "withdrawn"]
    assert sorted(e["rid"] for e in events) == sorted(p.request_id for p in shown)
    assert {e["by"] for e in events} == {"housekeeping"}
    for pending in shown:
        assert await redis.hget(keys.request(pending.request_id), "state") == "withdrawn"
    assert await eventually(_metric(worker, "qbroker_housekeeping_actions_total", action="withdrawn")) == 3


async def test_deadline_passes_and_the_waiting_asker_gets_timed_out(spawn_worker, make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    spawn_worker()
    async with answering.provider("p1") as provider:
        task = asyncio.create_task(asking.ask(one_question()))
        shown = await _next(provider)
        # Broker.ask() cannot set a deadline yet (see the report); set the field ask.lua stores.
        await redis.hset(asking.keys.request(shown.request_id), "deadline", 1)
        with pytest.raises(UserQuestionError) as caught:
            await asyncio.wait_for(task, 20)
        assert caught.value.code == "ASK_TIMED_OUT"
        await asyncio.wait_for(shown.withdrawn.wait(), 5)


async def test_poison_entry_is_dead_lettered_while_the_provider_keeps_answering(spawn_worker, make_broker, redis):
    asking, answering = await make_broker(), await make_broker()
    keys = asking.keys
    worker = spawn_worker()
    async with answering.provider("p1") as provider:
        await redis.xadd(keys.requests, {"kind": "bogus", "junk": "\x00"})  # malformed entry
        # A well-formed entry whose request does not decode (written by a broken peer).
        await redis.hset(
            keys.request("bad"),
            mapping={
                "state": "pending",
                "request": "{not json",
                "agent": "",
                "agent_fp": "",
                "client": "c1",
                "created": "0",
                "deadline": "",
            },
        )
        await redis.set(keys.client("c1"), "1", px=60_000)
        await redis.xadd(keys.requests, {"kind": "ask", "rid": "bad", "client": "c1", "agent": ""})
        task = asyncio.create_task(asking.ask(one_question()))
        pending = await _next(provider)
        await pending.answer(pick("yes"))
        assert await asyncio.wait_for(task, 5) == pick("yes")
    reasons = [f["reason"] for _, f in await redis.xrange(keys.dead)]
    assert reasons[0] == "malformed stream entry"
    assert reasons[1].startswith("undeliverable request")
    assert len(reasons) == 2
    assert await eventually(_metric(worker, "qbroker_dead_letters", namespace=keys.namespace)) == 2
    # Asks by outcome and time to answer, from the audit stream, counted once.
    assert await eventually(_metric(worker, "qbroker_asks_total", outcome="answered")) == 1
    assert await eventually(_metric(worker, "qbroker_asks_total", outcome="failed")) == 1  # the undecodable one
    assert await _metric(worker, "qbroker_time_to_answer_seconds_count")() == 1


async def test_two_workers_do_each_run_once(spawn_worker, redis, make_broker):
    broker = await make_broker()
    # Two deployments whose arq queues live in different databases: arq cannot deduplicate
    # their crons, only the run claim in the broker's Redis can.
    spawn_worker(arq_db=0)
    spawn_worker(arq_db=1)

    async def runs() -> list[dict[str, str]] | None:
        found = [f for _, f in await redis.xrange(runs_key(broker)) if f["job"] == "housekeeping"]
        return found if len(found) >= 4 else None

    found = await eventually(runs)
    slots = [f["slot"] for f in found]
    assert len(slots) == len(set(slots)), slots


# -- notifications ------------------------------------------------------------------------------


@dataclass
class Receiver:
    """A webhook receiver on loopback: answers with the statuses given, then 200."""

    statuses: list[int] = field(default_factory=list)
    hits: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.hits.append((dict(request.headers), await request.read()))
        status = self.statuses.pop(0) if self.statuses else 200
        return web.Response(status=status)


@pytest.fixture
async def receiver() -> AsyncIterator[Callable[..., Awaitable[Receiver]]]:
    runners: list[web.AppRunner] = []

    async def start(*statuses: int) -> Receiver:
        recv = Receiver(statuses=list(statuses))
        app = web.Application()
        app.router.add_post("/hook", recv.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        recv.url = f"http://127.0.0.1:{port}/hook"
        return recv

    yield start
    for runner in runners:
        await runner.cleanup()


def _notify_flags(url: str, *extra: str) -> tuple[str, ...]:
    return ("--webhook-url", url, "--webhook-secret", SECRET, "--notify-after", "0", "--backoff", "0.1", *extra)


async def _waiting_question(asking: Any, provider: Any) -> tuple[asyncio.Task[Any], Any]:
    task = asyncio.create_task(asking.ask(one_question()))
    return task, await _next(provider)


async def _stop(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@contextlib.asynccontextmanager
async def _notifying(
    spawn_worker: Any, make_broker: Any, receiver: Any, statuses: list[int], *, attempts: int
) -> AsyncIterator[tuple[Any, Any]]:
    """A worker told to notify (``attempts`` tries) a receiver that replies ``statuses`` in turn, and a question
    left waiting: the receiver and the worker; the ask is stopped after the block."""
    recv = await receiver(*statuses)
    asking, answering = await make_broker(), await make_broker()
    worker = spawn_worker(*_notify_flags(recv.url, "--attempts", str(attempts)))
    async with answering.provider("p1") as provider:
        task, _ = await _waiting_question(asking, provider)
        yield recv, worker
        await _stop(task)


async def test_signed_notification_sent_once_per_request(spawn_worker, make_broker, receiver, redis):
    recv = await receiver()
    asking, answering = await make_broker(), await make_broker()
    worker = spawn_worker(*_notify_flags(recv.url))
    async with answering.provider("p1") as provider:
        task, shown = await _waiting_question(asking, provider)

        async def delivered() -> bool:
            return bool(recv.hits)

        await eventually(delivered)
        headers, body = recv.hits[0]
        assert verify(SECRET, headers, body)
        assert not verify("wrong-secret", headers, body)
        assert shown.request_id.encode() in body
        # Two more notify runs later, still one delivery for this question.
        count = len(await redis.xrange(runs_key(answering)))

        async def two_more_runs() -> bool:
            return len(await redis.xrange(runs_key(answering))) >= count + 4

        await eventually(two_more_runs)
        assert len(recv.hits) == 1
        assert await eventually(_metric(worker, "qbroker_notifications_total", result="delivered")) == 1
        await _stop(task)


async def test_receiver_failing_twice_gets_one_counted_delivery(spawn_worker, make_broker, receiver):
    async with _notifying(spawn_worker, make_broker, receiver, [500, 503], attempts=5) as (recv, worker):
        assert await eventually(_metric(worker, "qbroker_notifications_total", result="delivered")) == 1
        assert len(recv.hits) == 3
        assert len({h[DELIVERY_HEADER] for h, _ in recv.hits}) == 1  # one notice, three attempts
        assert all(verify(SECRET, h, b) for h, b in recv.hits)
        assert await _metric(worker, "qbroker_notifications_total", result="retried")() == 2
        assert await _metric(worker, "qbroker_notifications_total", result="failed")() == 0


async def test_receiver_that_never_succeeds_is_given_up(spawn_worker, make_broker, receiver):
    async with _notifying(spawn_worker, make_broker, receiver, [500] * 50, attempts=3) as (recv, worker):
        assert await eventually(_metric(worker, "qbroker_notifications_total", result="failed")) == 1
        assert len(recv.hits) == 3
        assert await _metric(worker, "qbroker_notifications_total", result="delivered")() == 0
    assert "gave up on waiting notice" in worker.log.read_text()


async def test_unattended_queue_and_escalation(spawn_worker, make_broker, receiver, redis):
    notify, escalate = await receiver(), await receiver()
    asking, standing_by = await make_broker(), await make_broker()
    spawn_worker(*_notify_flags(notify.url, "--unattended-after", "0", "--escalation-url", escalate.url,
                                "--escalate-after", "0"))  # fmt: skip
    # A standby registration lets the ask in while nobody holds the lease.
    await redis.zadd(standing_by.keys.standbys, {"tok:standby": 2**50})
    task = asyncio.create_task(asking.ask(one_question()))

    async def both() -> bool:
        return bool(notify.hits and escalate.hits)

    await eventually(both)
    assert b'"event":"unattended"' in notify.hits[0][1]
    assert b'"event":"escalation"' in escalate.hits[0][1]
    await _stop(task)


async def test_a_question_is_paged_once_across_workers(
    spawn_worker, make_broker, receiver, redis, redis_server, namespace
):
    recv = await receiver()
    asking, answering = await make_broker(), await make_broker()
    arq_other = Redis.from_url(f"redis://127.0.0.1:{redis_server.port}/1")
    async with answering.provider("p1") as provider:
        task, _ = await _waiting_question(asking, provider)
        first = spawn_worker(*_notify_flags(recv.url), arq_db=0)

        async def delivered() -> bool:
            return bool(recv.hits)

        await eventually(delivered)
        first.process.terminate()
        await asyncio.to_thread(first.process.wait, 10)
        # Another deployment, its arq queue in another database: arq's job ids cannot
        # deduplicate across them; the per-request marker in the broker's Redis must.
        second = spawn_worker(*_notify_flags(recv.url), arq_db=1)

        async def second_ran_and_drained() -> bool:
            runs = [f for _, f in await redis.xrange(runs_key(answering)) if f["job"] == "notify"]
            ran = any(f["worker"].endswith(f":{second.process.pid}") for f in runs)
            queued = await arq_other.keys(f"arq:job:qb:{namespace}:*")  # deliveries not yet done
            return ran and not queued

        try:
            await eventually(second_ran_and_drained)
        finally:
            await arq_other.aclose()
        assert len(recv.hits) == 1
        await _stop(task)


@pytest.mark.timeout(60)
async def test_the_worker_rides_out_a_redis_restart(redis_factory, namespace, tmp_path):
    """Issue 26, item 3: `qbroker worker` died 0.2 s after Redis went down (arq's poll raised)."""
    server = redis_factory()
    worker = start_worker(server, namespace, tmp_path / "worker.log")
    try:
        runs = _metric(worker, "qbroker_housekeeping_actions_total", action="runs")
        assert await eventually(runs) >= 1
        server.kill()
        await asyncio.sleep(3)  # arq polls every 0.5 s: it meets the outage at once
        assert worker.process.poll() is None, worker.log.read_text()[-3000:]
        server.start()  # the same port, empty
        before = await runs()
        assert await eventually(lambda: _more(runs, before), within=30), worker.log.read_text()[-3000:]
        assert worker.process.poll() is None
        worker.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.process.wait, 15) == 0
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()


async def _more(read: Callable[[], Awaitable[float]], than: float) -> bool:
    return await read() > than
