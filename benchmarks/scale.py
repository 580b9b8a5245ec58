"""How the provider scales with a fleet: many askers of one question, many pending questions.

``python -m benchmarks.scale`` (small sizes, about a minute) or ``python -m benchmarks.scale --full``
(16 000 identical askers, a card of 8 000 answered, 100 000 pending). It starts its own
redis-server on a free port. The provider is a real ``Provider`` (``Broker.provider``) in this
process and nothing else runs here: the askers are other processes (``benchmarks.scale asker``),
each one ``Broker`` with many registered agents, every agent a distinct asker. So this process's
CPU time (``time.process_time``) is the provider's own CPU, Redis client work included and
redis-server's excluded.

Figures:
- provider CPU per ask with N agents asking the identical question (one card), and with N
  distinct questions (N cards), from the first ask until every asker is shown;
- provider CPU to answer the one card of N askers (``card.answer``; every asker gets it), and the seconds until
  ``card.answer`` returned (redis-server's settle.lua work and the askers collecting meanwhile included);
- with N questions pending: what showing the next one costs (``anext(provider)`` and the
  count of the others, as ``qbroker provide`` does), ``provider.first(50)`` (a page), the full
  ``provider.pending`` list, and the provider's memory per pending question (the Python heap
  it grew by, by ``tracemalloc``, over N);
  and ``qbroker status``'s read and text, of everything and with its default ``--limit 50``; and what the
  asking processes' RSS grew by per waiting ask (from before their first ask until every ask is shown);
- one asking process's Python heap per waiting ask, by ``tracemalloc`` (``--asker-heap N``: N asks waiting, each
  ``agent.ask(request, timeout=3600)`` in a task of its own, the task and the request included);
- what the waiting questions cost (Redis commands a second per question, redis-server's and the askers'
  CPU), while a maintenance worker is alive (its presence marker set; the worker itself does not run here)
  and with none, when the provider runs housekeeping itself every ``housekeeping_every`` (3 s);
- a failover with N pending (``--failover``): a plain provider holds the N, hands the lease over,
  and the web provider (``WebProvider``, standing by) takes it: the seconds from taking the lease
  until a page has been sent the first page (100 cards) and every card;
- ``qbroker web`` letting go of the lease on SIGTERM with N pending (``--sigterm``): a real web server process
  holds the N, is sent SIGTERM, and the seconds until its lease is gone from Redis (and until it exited) are
  timed here, the lease read every millisecond.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import inspect
import itertools
import json
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from benchmarks.keys import KEYS
from benchmarks.questions import YES, yes_or_no
from broker import (
    Broker,
    Provider,
    namespace_status,
)
from workers.operating.status.view import format_status
from workers.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
ASKERS, ASKERS_FULL = (1000, 4000), (1000, 4000, 8000, 16000)
PENDING, PENDING_FULL = (1000, 10000), (1000, 10000, 100000)
PROCESSES = 4
WAVE = 2000
"""asks an asking process sends before it waits for them to be enqueued"""
SWEEP_EVERY = 5.0
"""the askers' ``sweep_every`` (the default)"""
WINDOW = 3 * SWEEP_EVERY
"""seconds over which the cost of waiting questions is counted (``--window``)"""
"""asking processes per measurement"""
PRIORITIES = ("normal",) * 8 + ("urgent", "low")


def log(message: str) -> None:
    print(f"[scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the asking processes ------------------------------------------------------------------


async def asker(args: argparse.Namespace) -> None:
    """Register ``--agents`` agents, wait for ``go`` on stdin, then ask ``--asks`` questions
    spread over them (all the same question with ``--same``); print how many got an answer."""
    emit = _emitter()
    # Long TTLs: a starved asking process must not look stopped (its asks would be withdrawn), nor give Redis up
    # for unreachable when its own event loop is too busy to read a reply in time (every ask would fail).
    async with (
        Broker(
            args.url, args.namespace, agent_ttl=3600.0, client_ttl=3600.0, unavailable_after=3600.0, **KEYS
        ) as broker,
        contextlib.AsyncExitStack() as stack,
    ):
        agents = []
        for start in range(0, args.agents, 500):  # registered 500 at a time: one round trip each
            names = [f"{args.prefix}{n}" for n in range(start, min(args.agents, start + 500))]
            agents += await asyncio.gather(*(stack.enter_async_context(broker.agent(name)) for name in names))
        emit("ready")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if args.heap or args.heap_top:
            gc.collect()
            tracemalloc.start()
        asks: list[asyncio.Task[Any]] = []
        for start in range(0, args.asks, WAVE):
            for n in range(start, min(args.asks, start + WAVE)):
                request = (
                    yes_or_no("Deploy 2.4.0 to production?")
                    if args.same
                    else yes_or_no(f"{args.prefix}: step {n}, go on?", priority=PRIORITIES[n % len(PRIORITIES)])
                )
                asks.append(asyncio.create_task(agents[n % len(agents)].ask(request, timeout=3600)))
            await _enqueued(broker, len(asks))
        if args.heap or args.heap_top:  # the heap the waiting asks grew, their tasks and requests included
            # The commands' sender keeps its last pipeline (the last wave's ask.lua calls) until it sends the next:
            # a cost of one pipeline, not of every waiting ask, so another command goes first.
            await broker.commands.call("PING")
            gc.collect()
            if args.heap_top:  # where the heap went, per waiting ask
                _write_top(args.heap_top, tracemalloc.take_snapshot(), args.asks, "ask")
            emit("asked", heap_per_ask_b=tracemalloc.get_traced_memory()[0] / max(1, args.asks))
            tracemalloc.stop()
        else:
            emit("asked")
        results = await asyncio.gather(*asks, return_exceptions=True)
        emit("answered", count=sum(1 for result in results if result == YES))


async def _enqueued(broker: Broker, n: int) -> None:
    """Until ``n`` asks of this process wait in Redis (ask.lua enqueued them; reads private state, polled).

    Asks go in waves of ``WAVE``: one pipeline of 25 000 ask.lua calls outlasts the command reply timeout
    on these cores, and is sent again, and again."""
    inbox = broker._core.inbox
    assert inbox is not None
    while len(inbox._asked_at) < n:  # noqa: ASYNC110 (the asks the ask script accepted)
        await asyncio.sleep(0.02)


def _emitter() -> Callable[..., None]:
    def emit(event: str, **fields: Any) -> None:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()

    return emit


class Askers:
    """``PROCESSES`` asking processes that together ask ``asks`` questions as ``agents`` agents."""

    def __init__(
        self, url: str, namespace: str, *, asks: int, agents: int, same: bool, processes: int = PROCESSES
    ) -> None:
        self.url, self.namespace, self.same = url, namespace, same
        self.asks, self.agents, self.processes = asks, agents, processes
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, *extra: str) -> None:
        processes = self.processes
        for index in range(processes):
            asks = self.asks // processes + (index < self.asks % processes)
            agents = max(1, self.agents // processes + (index < self.agents % processes))
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "benchmarks.scale", "asker", "--url", self.url,
                    "--namespace", self.namespace, "--prefix", f"p{index}-", "--asks", str(asks),
                    "--agents", str(agents), *(["--same"] if self.same else []), *extra,
                    cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
            )  # fmt: skip
        for proc in self.procs:
            await self._expect(proc, "ready")

    def cpu_s(self) -> float:
        """The asking processes' CPU seconds so far (user and system, from /proc)."""
        total = 0
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
        return total / os.sysconf("SC_CLK_TCK")

    def rss_kb(self) -> int:
        """The asking processes' resident memory in all (KiB, from /proc)."""
        return sum(_rss_kb(proc.pid) for proc in self.procs)

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")

    async def asked(self) -> list[dict[str, Any]]:
        return [await self._expect(proc, "asked") for proc in self.procs]

    async def answered(self) -> int:
        return sum([(await self._expect(proc, "answered"))["count"] for proc in self.procs])

    async def _expect(self, proc: asyncio.subprocess.Process, event: str) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 300)
            if not line:
                raise RuntimeError(f"an asking process exited ({await proc.wait()}) before {event!r}")
            got: dict[str, Any] = json.loads(line)
            if got["event"] == event:
                return got

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


# -- the measurements ----------------------------------------------------------------------


async def shown(provider: Provider, n: int, within: float = 600.0) -> None:
    """Until ``n`` askers' requests are shown; reads a count kept as they come, so polling costs nothing measurable."""
    deadline = time.monotonic() + within
    while provider.asker_count < n:  # polled: an event fired per ask would cost more than it saves
        if time.monotonic() > deadline:
            raise RuntimeError(f"{provider.asker_count} of {n} asks shown after {within:.0f}s")
        await asyncio.sleep(0.05)


async def coalescing(url: str, n: int, *, same: bool) -> dict[str, float]:
    """Provider CPU per ask for ``n`` agents asking one question (``same``) or each its own."""
    namespace = f"scale-{'same' if same else 'unique'}-{n}"
    askers = Askers(url, namespace, asks=n, agents=n, same=same)
    try:
        await askers.start()
        async with Broker(url, namespace, lease_ttl=60.0, **KEYS) as broker, broker.provider("bench") as provider:
            await asyncio.sleep(0.2)  # the provider's first reads are done
            cpu = time.process_time()
            askers.go()
            await shown(provider, n)
            figures = {"cpu_per_ask_ms": (time.process_time() - cpu) * 1000 / n}
            if same:
                card = await anext(provider)
                assert len(card.askers) == n, f"{len(card.askers)} askers of {n} on the card"
                cpu, wall = time.process_time(), time.perf_counter()
                await card.answer(YES, by="bench")
                figures["answer_cpu_s"] = time.process_time() - cpu
                figures["answer_s"] = time.perf_counter() - wall
                got = await askers.answered()
                assert got == n, f"{got} of {n} askers got the answer"
        return figures
    finally:
        await askers.stop()


async def per_call(call: Callable[[], Awaitable[Any] | Any], *, most: int = 1000, rounds: int = 5) -> float:
    """Seconds per call: the best of ``rounds`` rounds of up to ``most`` / ``rounds`` calls (and at
    most 0.2 s each), so that a collection of the garbage of everything else does not decide it."""
    best = float("inf")
    for _ in range(rounds):
        calls, started = 0, time.perf_counter()
        while calls < max(1, most // rounds) and (calls < 1 or time.perf_counter() - started < 0.2):
            result = call()
            if asyncio.iscoroutine(result):
                await result
            calls += 1
        best = min(best, (time.perf_counter() - started) / calls)
    return best


async def pending(url: str, n: int, window: float = WINDOW) -> dict[str, float]:
    """With ``n`` questions pending (100 per agent, a tenth urgent, a tenth low): what showing costs."""
    namespace = f"scale-pending-{n}"
    askers = Askers(url, namespace, asks=n, agents=max(1, n // 100), same=False)
    try:
        await askers.start()
        async with Broker(url, namespace, lease_ttl=60.0, **KEYS) as broker:
            # As if a maintenance worker were alive: the provider's own housekeeping is measured on its own below.
            await broker.commands.call("SET", broker.keys.worker_alive, "bench", "PX", 3_600_000)
            async with broker.provider("bench") as provider:
                return await _pending_figures(url, n, window, askers, broker, provider)
    finally:
        await askers.stop()


async def _pending_figures(
    url: str, n: int, window: float, askers: Askers, broker: Broker, provider: Provider
) -> dict[str, float]:
    """What showing, paging, the status and waiting cost with ``n`` pending (``pending``)."""
    await asyncio.sleep(0.2)
    gc.collect()
    tracemalloc.start()  # slows the delivery, which is not timed here; stopped before the timings
    askers_rss = askers.rss_kb()
    askers.go()
    await shown(provider, n)
    gc.collect()
    figures = {"memory_per_pending_b": tracemalloc.get_traced_memory()[0] / n}
    # Every ask is waiting now (shown, so enqueued): what the asking processes grew by, their own request objects
    # and the tasks that await the asks included (as any caller has them).
    figures["asker_rss_per_waiting_b"] = (askers.rss_kb() - askers_rss) * 1024 / n
    tracemalloc.stop()
    if window:
        await asyncio.sleep(min(SWEEP_EVERY, window))  # every ask is old enough for the askers' sweeps
        figures.update(await waiting_cost(url, n, askers, window))
        await broker.commands.call("DEL", broker.keys.worker_alive)  # no worker: the provider housekeeps
        await asyncio.sleep(broker.housekeeping_every or 0)  # it has seen the marker gone
        alone = await waiting_cost(url, n, askers, window)
        figures.update({f"{name}_no_worker": value for name, value in alone.items()})
        await broker.commands.call("SET", broker.keys.worker_alive, "bench", "PX", 3_600_000)  # the rest unhindered
    first = getattr(provider, "first", None)
    count = getattr(type(provider), "pending_count", None)
    figures["pending_ms"] = await per_call(lambda: provider.pending, most=10) * 1000
    if first is not None:
        figures["first_1_us"] = await per_call(lambda: first(1)) * 1e6
        figures["first_50_us"] = await per_call(lambda: first(50)) * 1e6

    async def show_next() -> None:  # what `qbroker provide` does per question shown
        await anext(provider)
        _ = provider.pending_count if count is not None else len(provider.pending)

    figures["show_next_us"] = await per_call(show_next, most=200 if count is not None else 20) * 1e6
    figures["status_all_s"], figures["status_all_kb"] = await status_cost(broker, None)
    if "limit" in inspect.signature(namespace_status).parameters:
        figures["status_s"], figures["status_kb"] = await status_cost(broker, 50)
    return figures


_RUNS = itertools.count(1)


async def asker_heap(url: str, n: int, heap_top: str | None = None) -> float:
    """Bytes of Python heap per waiting ask in one asking process with ``n`` asks waiting, by ``tracemalloc`` (the
    benchmark's own task and request per ask included, as any caller has them); a provider holds the lease.
    ``heap_top``: a file the asking process writes its top allocation sites to."""
    namespace = f"scale-heap-{n}-{next(_RUNS)}"
    askers = Askers(url, namespace, asks=n, agents=max(1, n // 100), same=False, processes=1)
    try:
        await askers.start("--heap", *(["--heap-top", heap_top] if heap_top else []))
        async with Broker(url, namespace, lease_ttl=60.0, **KEYS) as broker, broker.provider("bench"):
            await asyncio.sleep(0.2)
            askers.go()
            (asked,) = await askers.asked()
            return float(asked["heap_per_ask_b"])
    finally:
        await askers.stop()


async def failover(url: str, n: int, profile: str | None = None, housekeeping: bool = True) -> dict[str, float]:
    """Seconds from the web provider taking the lease (``n`` pending, handed over) to a page seeing
    the first page of cards and all of them (counted in the events a page is sent); then a second web
    provider takes them over from the first under ``tracemalloc``: the heap it grew by, per card
    (the provider core and the web service's own state per card, as a ``qbroker web`` holds them).
    ``profile``: a file for the cProfile statistics of the first take-over. ``housekeeping`` False: the web
    provider runs no housekeeping of its own (as when a maintenance worker is alive)."""
    from workers.answering.web.keys import WebKeys
    from workers.answering.web.service import WebProvider

    namespace = f"scale-failover-{n}-{next(_RUNS)}"  # each run its own: a run's askers leave their asks behind
    askers = Askers(url, namespace, asks=n, agents=max(1, n // 100), same=False)
    no_housekeeping: dict[str, Any] = {} if housekeeping else {"housekeeping_every": None}
    try:
        await askers.start()
        async with (
            Broker(url, namespace, lease_ttl=60.0, **no_housekeeping, **KEYS) as web,
            Broker(url, namespace, lease_ttl=60.0, **KEYS) as old,
        ):
            service = WebProvider(web, name="bench-web", keys=WebKeys(namespace))
            queue: asyncio.Queue[Any] = asyncio.Queue()  # unbounded: this page never falls behind
            async with service.subscribe(queue):
                async with old.provider("bench-old") as holder:
                    askers.go()
                    await shown(holder, n)
                    log(f"{n} pending; the web provider takes them over")
                    running = asyncio.create_task(service.run())
                    while service.status != "standby":  # noqa: ASYNC110 (polled: the status has no event of its own)
                        await asyncio.sleep(0.01)
                    profiler = cProfile.Profile(time.process_time) if profile is not None else None
                    cpu = time.process_time()
                    if profiler is not None:
                        profiler.enable()
                figures = await _taken_over(queue, n)
                figures["cpu_s"] = time.process_time() - cpu
                if profiler is not None and profile is not None:
                    profiler.disable()
                    profiler.dump_stats(profile)
            await _stopped(running)
            gc.collect()
            rss = _rss_kb()
            tracemalloc.start()
            second = WebProvider(web, name="bench-web-2", keys=WebKeys(namespace))
            async with second.subscribe(asyncio.Queue()) as queue:
                running = asyncio.create_task(second.run())
                await _taken_over(queue, n)
            gc.collect()
            figures["web_memory_per_pending_b"] = tracemalloc.get_traced_memory()[0] / n
            if profile:
                _write_top(f"{profile}.memory.txt", tracemalloc.take_snapshot(), n)
            tracemalloc.stop()
            figures["web_rss_per_pending_b"] = (_rss_kb() - rss) * 1024 / n
            await _stopped(running)
        return figures
    finally:
        await askers.stop()


async def sigterm(url: str, n: int) -> dict[str, float]:
    """Seconds from SIGTERM to a ``qbroker web`` process holding ``n`` pending having released its lease, and
    to its exit."""
    from workers.answering.web.keys import WebKeys  # noqa: F401 (the web package loads here, as for --failover)

    namespace = f"scale-sigterm-{n}-{os.getpid()}-{time.monotonic_ns()}"
    port = _free_port()
    web = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.answering.web", "--port", str(port), "--redis-url", url,
        "--namespace", namespace, "--name", "bench-web", "--token", "bench=bench-token-0123456789abcdef",
        "--lease-ttl", "60", cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    askers = Askers(url, namespace, asks=n, agents=max(1, n // 100), same=False)
    try:
        async with Broker(url, namespace, **KEYS) as watcher:
            lease = watcher.keys.provider
            while await watcher.commands.call("GET", lease) is None:  # noqa: ASYNC110 (Redis has no event for it)
                await asyncio.sleep(0.05)
            await askers.start()
            askers.go()
            while True:  # every ask delivered to the web server, and given a moment to list them
                summary = await watcher.commands.call("XPENDING", watcher.keys.requests, "providers")
                if summary and int(summary[0] if isinstance(summary, list) else summary["pending"]) >= n:
                    break
                await asyncio.sleep(0.5)
            await _settled(web.pid)  # and shown: the web server has gone quiet
            log(f"{n} pending at the web server; SIGTERM")
            async with Redis.from_url(url, decode_responses=True) as redis:
                started = time.perf_counter()
                web.send_signal(signal.SIGTERM)
                while await redis.exists(lease):  # noqa: ASYNC110 (polled: read every millisecond)
                    await asyncio.sleep(0.001)
                released = time.perf_counter() - started
            await asyncio.wait_for(web.wait(), 120)
            return {"released_s": released, "exited_s": time.perf_counter() - started}
    finally:
        if web.returncode is None:
            web.kill()
            await web.wait()
        await askers.stop()


async def _settled(pid: int, most: float = 300.0) -> None:
    """Until the process spends under 0.1 s of CPU in a second (its backlog taken in), ``most`` seconds at most."""
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu_s() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    deadline = time.monotonic() + most
    before = cpu_s()
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = cpu_s()
        if now - before < 0.1:
            return
        before = now


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _taken_over(queue: asyncio.Queue[Any], n: int) -> dict[str, float]:
    """Seconds from a page's web provider going active to the page having the first 100 cards, and all ``n``."""
    seen, first_s, started = 0, None, None
    while seen < n:
        event = await asyncio.wait_for(queue.get(), 600)
        if event is None:
            raise RuntimeError("the page's stream ended")
        if event["type"] == "status" and event["status"] == "active" and started is None:
            started = time.perf_counter()
        if event["type"] in ("added", "addedMany"):
            seen += len(event["requests"]) if event["type"] == "addedMany" else 1
        if first_s is None and started is not None and seen >= min(n, 100):
            first_s = time.perf_counter() - started
    assert started is not None and first_s is not None
    return {"first_page_s": first_s, "all_s": time.perf_counter() - started}


async def _stopped(running: asyncio.Task[None]) -> None:
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


def _write_top(path: str, snapshot: tracemalloc.Snapshot, n: int, per: str = "card") -> None:
    top = snapshot.statistics("lineno")[:40]
    Path(path).write_text(
        "\n".join(f"{stat.size / n:8.0f} B/{per} {stat.count / n:5.2f}/{per}  {stat}" for stat in top)
    )


def _rss_kb(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def waiting_cost(url: str, n: int, askers: Askers, window: float) -> dict[str, float]:
    """Redis commands per second per waiting question, redis-server's CPU and the asking processes'
    CPU, over ``window`` seconds while ``n`` questions wait and nobody answers (the askers' sweeps,
    beats and blocking reads, the provider's renewals and reads; INFO's own commands excluded)."""
    async with Redis.from_url(url, decode_responses=True) as redis:
        before, cpu_before = await _commands_and_cpu(redis)
        askers_before, started = askers.cpu_s(), time.monotonic()
        await asyncio.sleep(window)
        after, cpu_after = await _commands_and_cpu(redis)
        askers_after, elapsed = askers.cpu_s(), time.monotonic() - started
    return {
        "commands_per_s_per_waiting": (after - before - 2) / elapsed / n,
        "redis_cpu_pct": (cpu_after - cpu_before) / elapsed * 100,
        "askers_cpu_pct": (askers_after - askers_before) / elapsed * 100,
    }


async def _commands_and_cpu(redis: Redis) -> tuple[int, float]:
    stats, cpu = await redis.info("stats"), await redis.info("cpu")
    return int(stats["total_commands_processed"]), float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def status_cost(broker: Broker, limit: int | None) -> tuple[float, float]:
    """Seconds to read and format ``qbroker status`` (``limit`` None: everything), and its text in KiB."""
    started = time.perf_counter()
    status = await (namespace_status(broker) if limit is None else namespace_status(broker, limit=limit))
    text = format_status(status)
    return time.perf_counter() - started, len(text.encode()) / 1024


# -- the report ----------------------------------------------------------------------------


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _firsts(figures: dict[str, float]) -> str:
    if "first_50_us" not in figures:
        return "-"
    return f"{figures['first_1_us']:.1f}, {figures['first_50_us']:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _growth(what: str, table: dict[int, dict[str, float]], figure: str, unit: str) -> str:
    """How ``figure`` grows from the table's smallest size to its largest (the target: within 2x)."""
    low, high = min(table), max(table)
    return f"{what}, {high} vs {low} {unit}: {_ratio(table[high][figure], table[low][figure])} (target within 2x)"


async def measure(args: argparse.Namespace) -> int:
    askers_levels = [n for n in args.askers or (ASKERS_FULL if args.full else ASKERS) if n]
    pending_levels = [n for n in args.pending or (PENDING_FULL if args.full else PENDING) if n]
    with tempfile.TemporaryDirectory(prefix="qb-scale-") as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            same: dict[int, dict[str, float]] = {}
            unique: dict[int, dict[str, float]] = {}
            for n in askers_levels:
                same[n] = await coalescing(server.url, n, same=True)
                log(f"{n} askers of one question: {same[n]}")
                unique[n] = await coalescing(server.url, n, same=False)
                log(f"{n} askers of distinct questions: {unique[n]}")
            failovers: list[tuple[int, dict[str, float]]] = []
            for n in args.failover or ():
                for _ in range(args.runs):
                    failovers.append((n, await failover(server.url, n, args.profile, not args.no_self_housekeeping)))
                    log(f"failover with {n} pending: {failovers[-1][1]}")
            sigterms: list[tuple[int, dict[str, float]]] = []
            for n in args.sigterm or ():
                for _ in range(args.runs):
                    sigterms.append((n, await sigterm(server.url, n)))
                    log(f"SIGTERM with {n} pending: {sigterms[-1][1]}")
            heaps: list[tuple[int, float]] = []
            for n in args.asker_heap or ():
                for _ in range(args.runs):
                    heaps.append((n, await asker_heap(server.url, n, args.heap_top)))
                    log(f"one asking process, {n} waiting: {heaps[-1][1]:.0f} B of heap per waiting ask")
            waiting: dict[int, dict[str, float]] = {}
            for n in pending_levels:
                waiting[n] = await pending(server.url, n, args.window)
                log(f"{n} pending: {waiting[n]}")
        finally:
            server.kill()
    if same or waiting:
        print(report(same, unique, waiting, args.window))
    if failovers:
        print(failover_report(failovers))
    if sigterms:
        print(sigterm_report(sigterms))
    for n, heap in heaps:
        print(f"one asking process, {n} asks waiting: {heap:.0f} B of heap per waiting ask (tracemalloc; target 3 KB)")
    return 0


def report(
    same: dict[int, dict[str, float]],
    unique: dict[int, dict[str, float]],
    waiting: dict[int, dict[str, float]],
    window: float = WINDOW,
) -> str:
    out = ["Coalescing (provider CPU; redis-server and the asking processes are not in it)", ""]
    out.append(
        "| askers | CPU per ask, one question (ms) | distinct questions (ms) | ratio | answering the card: CPU (s) |"
        " until answered (s) |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|")
    for n in same:
        one, many = same[n]["cpu_per_ask_ms"], unique[n]["cpu_per_ask_ms"]
        out.append(
            f"| {n} | {one:.3f} | {many:.3f} | {_ratio(one, many)} | {same[n]['answer_cpu_s']:.3f} |"
            f" {same[n]['answer_s']:.3f} |"
        )
    if same:
        high = max(same)
        out += ["", _growth("one question", same, "cpu_per_ask_ms", "askers")]
        out.append(
            f"one question vs distinct questions, {high} askers:"
            f" {_ratio(same[high]['cpu_per_ask_ms'], unique[high]['cpu_per_ask_ms'])} (target within 3x)"
        )
        out.append(
            f"answering the card of {high}: {same[high]['answer_cpu_s']:.3f} s of CPU,"
            f" {same[high]['answer_s']:.3f} s until answered (target 0.1 s at 8000)"
        )
    out += ["", "Pending questions (one provider)", ""]
    out.append(
        "| pending | show next + count (us) | first(1), first(50) (us) | pending, all (ms) | memory per pending (B) |"
        " status, all (s, KiB) | status --limit 50 (s, KiB) | asking processes' RSS per waiting ask (B) |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, f in waiting.items():
        limited = "-" if "status_s" not in f else f"{f['status_s']:.2f}, {f['status_kb']:.0f}"
        out.append(
            f"| {n} | {_cell(f.get('show_next_us'), 1)} | {_firsts(f)} | {f['pending_ms']:.2f} |"
            f" {f['memory_per_pending_b']:.0f} | {f['status_all_s']:.2f}, {f['status_all_kb']:.0f} | {limited} |"
            f" {_cell(f.get('asker_rss_per_waiting_b'), 0)} |"
        )
    if waiting:
        high = max(waiting)
        out += ["", _growth("show next", waiting, "show_next_us", "pending")]
        out.append(
            f"asking processes' RSS per waiting ask at {high}: {waiting[high]['asker_rss_per_waiting_b']:.0f} B"
            " (target at most 3 KB)"
        )
    if waiting and window:
        title = f"Waiting questions, nobody answering (over {window:g} s; askers sweep every {SWEEP_EVERY:g} s)"
        out += ["", title, ""]
        out.append(
            "| waiting | maintenance worker | Redis commands/s per waiting question | redis-server CPU (% of a core) |"
            f" the {PROCESSES} asking processes' CPU (% of a core) |"
        )
        out.append("|---:|---|---:|---:|---:|")
        for n, f in waiting.items():
            for worker, suffix in (("alive", ""), ("none: the provider housekeeps", "_no_worker")):
                out.append(
                    f"| {n} | {worker} | {f['commands_per_s_per_waiting' + suffix]:.4f} |"
                    f" {f['redis_cpu_pct' + suffix]:.1f} | {f['askers_cpu_pct' + suffix]:.1f} |"
                )
        out.append("")
        high = max(waiting)
        out.append(
            f"commands/s per waiting question at {high}: {waiting[high]['commands_per_s_per_waiting']:.4f},"
            f" with no worker {waiting[high]['commands_per_s_per_waiting_no_worker']:.4f} (target at most 0.02)"
        )
    return "\n".join(out)


def failover_report(failovers: list[tuple[int, dict[str, float]]]) -> str:
    out = ["", "A failover to the web provider (from taking the lease)", ""]
    out.append(
        "| pending | first page, 100 cards (s) | every card (s) | the take-over's CPU (s) |"
        " web provider's heap per card (B) | RSS per card (B) |"
    )
    out.append("|---:|---:|---:|---:|---:|---:|")
    for n, f in failovers:
        out.append(
            f"| {n} | {f['first_page_s']:.3f} | {f['all_s']:.2f} | {f['cpu_s']:.2f} |"
            f" {f['web_memory_per_pending_b']:.0f} | {f['web_rss_per_pending_b']:.0f} |"
        )
    out += ["", "targets at 100000: the first page within 1 s, every card within 10 s, at most 3 KB per pending card"]
    return "\n".join(out)


def sigterm_report(runs: list[tuple[int, dict[str, float]]]) -> str:
    out = ["", "`qbroker web` sent SIGTERM (a real process; the lease read every millisecond)", ""]
    out.append("| pending | lease released (s) | process exited (s) |")
    out.append("|---:|---:|---:|")
    out += [f"| {n} | {f['released_s']:.3f} | {f['exited_s']:.2f} |" for n, f in runs]
    out += ["", "target at 100000: the lease released within 0.5 s"]
    return "\n".join(out)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["asker"]:
        parser = argparse.ArgumentParser(prog="benchmarks.scale asker")
        for flag in ("--url", "--namespace", "--prefix"):
            parser.add_argument(flag, required=True)
        parser.add_argument("--asks", type=int, required=True)
        parser.add_argument("--agents", type=int, required=True)
        parser.add_argument("--same", action="store_true")
        parser.add_argument("--heap", action="store_true", help="say the heap per waiting ask, by tracemalloc")
        parser.add_argument("--heap-top", help="write where that heap went (the top allocation sites) to this file")
        asyncio.run(asker(parser.parse_args(argv[1:])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="16 000 askers and 100 000 pending (several minutes)")
    parser.add_argument("--askers", type=_ints, help="comma-separated asker counts (default 1000,4000; 0 none)")
    parser.add_argument("--pending", type=_ints, help="comma-separated pending counts (default 1000,10000; 0 none)")
    parser.add_argument(
        "--failover", type=_ints, help="pending counts: a failover to the web provider with each (default none)"
    )
    parser.add_argument(
        "--sigterm", type=_ints, help="pending counts: SIGTERM to a `qbroker web` holding each (default none)"
    )
    parser.add_argument(
        "--asker-heap",
        type=_ints,
        help="waiting-ask counts: one asking process's heap per waiting ask, by tracemalloc (default none)",
    )
    parser.add_argument("--heap-top", help="with --asker-heap: write the asking process's top allocation sites here")
    parser.add_argument(
        "--runs", type=int, default=1, help="how many times each --failover, --sigterm and --asker-heap is measured"
    )
    parser.add_argument("--profile", help="write the cProfile statistics of the (last) failover's take-over here")
    parser.add_argument(
        "--no-self-housekeeping",
        action="store_true",
        help="the failover's web provider runs no housekeeping of its own (as with a maintenance worker alive)",
    )
    parser.add_argument(
        "--window", type=float, default=WINDOW, help=f"seconds to count waiting questions' cost ({WINDOW:g}; 0 none)"
    )
    return asyncio.run(measure(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
