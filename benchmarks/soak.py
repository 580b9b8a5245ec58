"""A soak: N asks while the active provider is killed with SIGKILL at random (seeded) moments.

    python -m benchmarks.soak --asks 5000 --kills 10 --seed 1

It starts a private ``redis-server``, ``--providers`` ``qbroker auto`` processes (one holds the
lease, the others stand by; a short ``--lease-ttl``) answering every question with its first
option, and fires ``--asks`` asks from this process with at most ``--concurrency`` waiting at
once. Each ask offers one label of its own (``ok-<i>``), so an answer crossed between asks is
caught. When the number of answered asks reaches each of ``--kills`` thresholds (drawn with
``--seed``), plus a random delay, it SIGKILLs the process holding the lease and starts a fresh
standby in its place.

At the end it checks that every ask returned exactly one answer, its own, and that the audit
stream and the askers' log (``qb:{ns}:audit``, ``qb:{ns}:asklog``, read as they grow so that their
caps trim nothing unread) show every
request asked once and answered once: no request answered twice, none cancelled, withdrawn or
expired, none lost. It prints the counts; ``--json`` prints them as one JSON object instead.
Exit status 0 when nothing was lost or doubled, 1 otherwise.

More faults, each off by default (issue 11), at random (seeded) moments while asks run:

- ``--redis-kills N``: Redis runs with AOF (everysec) and is SIGKILLed N times, every 1-3 s,
  and restarted 0.1-1 s later on the same port. AOF everysec may lose the last second of
  writes, audit entries included, so the asker's own counts are then the ground truth.
- ``--client-kills N``: N times, every 0.5-2 s, one client connection picked at random
  (the asker's, a provider's, blocking or not) is closed with CLIENT KILL.
- ``--proxy``: the asker and the providers reach Redis through tests/faultproxy.py, and
  ``--proxy-faults N`` injects N faults, every 0.5-2 s: a dropped BLMPOP, XREADGROUP or
  EVALSHA reply (with its connection), a reset of every connection, 0.5-2 s of silence, or
  1-2 s of 50-200 ms delay.

Keyed asks (issue 14), off by default: ``--keyed N`` runs N ``qbroker ask --key`` processes
(one agent id and key each) beside the asks above, and ``--keyed-kills M`` SIGKILLs M of them at
a random moment of their question and starts the same command again. Every key must end with
exactly its own answer, asked once (the restart re-attaches or collects, never asks again).

An ask that ends ASK_TIMED_OUT (``--ask-timeout``) is counted as hung: the providers answer at
once, so it waited for something that never came. An ask answered only at its timeout (within
10% of it) had lost its notice: withdrawing found the request answered and returned that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import BusyLoadingError, ConnectionError, ResponseError, TimeoutError

from benchmarks.keys import ENV as KEY_ENV
from benchmarks.keys import KEYS
from benchmarks.processes import stop_process
from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest, Broker, UserQuestionError
from workers.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
# Keyed questions get think time, so that a kill often lands while the question is pending.
RULES = '[default]\nfirst = true\n\n[[rule]]\nquestion = "^keyed "\nfirst = true\ndelay = 0.4\n'

HOLDING = re.compile(r"holding the lease of \S+ as (\S+) \(epoch (\d+)\)")


@dataclass
class Result:
    asks: int
    answers: int = 0
    wrong_answers: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    kills: int = 0
    failovers: int = 0
    providers_started: int = 0
    audit_asked: int = 0
    audit_answered: int = 0
    audit_other: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    lost: int = 0
    stream_left: int = 0
    epochs: list[int] = field(default_factory=list)
    wall_seconds: float = 0.0
    takeover_seconds: list[float] = field(default_factory=list)
    """from each SIGKILL to a standby announcing it holds the lease"""
    notes: list[str] = field(default_factory=list)
    """the providers' lease lines and anything unexpected they printed"""
    redis_kills: int = 0
    client_kills: int = 0
    proxy_faults: dict[str, int] = field(default_factory=dict)
    hung: int = 0
    """asks that ended ASK_TIMED_OUT although the providers answer at once"""
    answered_at_timeout: int = 0
    """asks whose answer came only at their timeout: a lost notice, found when the ask withdrew"""
    slowest_answer: float = 0.0
    providers_died: int = 0
    """provider processes that exited although nobody killed them"""
    died: list[str] = field(default_factory=list)
    """the last line each of those printed"""
    keyed: int = 0
    keyed_answers: int = 0
    keyed_kills: int = 0
    """keyed askers SIGKILLed while their question was out (then started again)"""
    keyed_wrong: int = 0
    keyed_failed: dict[str, int] = field(default_factory=dict)
    """exit statuses of keyed askers that ended without an answer"""
    keyed_asked_twice: int = 0
    """keys whose restarted asker asked a second question instead of re-attaching"""

    @property
    def ok(self) -> bool:
        clean = not self.wrong_answers and not self.audit_other and not self.errors and not self.providers_died
        keyed = self.keyed_answers == self.keyed and not self.keyed_wrong and not self.keyed_asked_twice
        return clean and keyed and self.duplicates == 0 and self.lost == 0 and self.answers == self.asks


class Provider:
    """One ``qbroker auto`` process; its stderr is drained and the lease lines kept."""

    def __init__(self, process: asyncio.subprocess.Process, name: str, on_holding: asyncio.Event) -> None:
        self.process = process
        self.name = name
        self.epoch = 0
        self.answered = 0
        self.killed = False  # by the soak (not by itself)
        self.notes: list[str] = []
        self._on_holding = on_holding
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(
        cls, url: str, namespace: str, name: str, rules: Path, lease_ttl: float, on_holding: asyncio.Event
    ) -> Provider:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")} | KEY_ENV
        env.update(QBROKER_REDIS_URL=url, QBROKER_NAMESPACE=namespace, QBROKER_LEASE_TTL=str(lease_ttl))
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers", "auto", "--rules", str(rules), "--name", name,
            cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        return cls(process, name, on_holding)

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line.startswith("qbroker auto: answered "):
                self.answered += 1
            elif found := HOLDING.search(line):
                self.epoch = int(found.group(2))
                self._on_holding.set()
                self.notes.append(line)
            elif "standing by" not in line:
                self.notes.append(line)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def kill(self) -> None:
        self.killed = True
        self.process.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        await stop_process(self.process, grace=10)
        await self._reader


def request_for(index: int) -> AskUserQuestionRequest:
    item = AskUserQuestionItem(
        id="q",
        question=f"soak question {index}",
        options=(AskUserQuestionOption(label=f"ok-{index}"), AskUserQuestionOption(label="other")),
    )
    return AskUserQuestionRequest(questions=(item,))


_REDIS_DOWN = (ConnectionError, TimeoutError, BusyLoadingError, OSError)


async def follow_audit(redis: Redis, key: str, events: list[tuple[str, str, str]], stop: asyncio.Event) -> None:
    """Read the audit stream as it grows: (event, rid, epoch or, for `asked`, the agent id) per entry."""
    last = "0-0"
    while True:
        try:
            replies = await redis.xread({key: last}, count=1000, block=200)
        except _REDIS_DOWN:  # Redis killed (--redis-kills) or this connection killed (--client-kills)
            if stop.is_set():
                return
            await asyncio.sleep(0.1)
            continue
        for _, entries in replies:
            for entry_id, fields in entries:
                last = entry_id
                event = fields.get("event", "")
                third = fields.get("agent", "") if event == "asked" else fields.get("epoch", "")
                events.append((event, fields.get("rid", ""), third))
        if not replies and stop.is_set():
            return


async def keyed_asker(url: str, namespace: str, index: int, kill_after: float | None, result: Result) -> None:
    """One ``qbroker ask --key``; with ``kill_after``, SIGKILLed then, mid-question, and run again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")} | KEY_ENV
    env.update(QBROKER_REDIS_URL=url, QBROKER_NAMESPACE=namespace)
    args = ("ask", "--agent", f"keyed-{index}", "--key", f"key-{index}", "-q", f"keyed {index}?",
            "-o", f"ok-k{index}", "-o", "other", "--timeout", "120")  # fmt: skip

    async def start() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers", *args, cwd=ROOT, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip

    process = await start()
    if kill_after is not None:
        try:
            await asyncio.wait_for(process.wait(), kill_after)
        except asyncio.TimeoutError:  # noqa: UP041 (TimeoutError here is redis-py's)
            with contextlib.suppress(ProcessLookupError):  # it may have ended as the wait ran out
                process.kill()
                result.keyed_kills += 1
        out, err = await process.communicate()
        if process.returncode != 0 and not out.strip():
            # killed (or failed) before it printed its answer: the same command again picks the question up
            process = await start()
            out, err = await asyncio.wait_for(process.communicate(), 150)
    else:
        out, err = await asyncio.wait_for(process.communicate(), 150)
    # a process killed while closing, its answer already printed, has it: the answer is what counts
    if process.returncode != 0 and not out.strip():
        key = str(process.returncode)
        result.keyed_failed[key] = result.keyed_failed.get(key, 0) + 1
        result.notes.append(f"keyed-{index}: {err.decode(errors='replace').strip()[-300:]}")
        return
    answer = json.loads(out)
    if [item["selected"] for item in answer["answers"]] != [[f"ok-k{index}"]]:
        result.keyed_wrong += 1
    result.keyed_answers += 1


async def patiently(call: Any, within: float = 30.0) -> Any:
    """Await ``call()`` again while Redis is restarting."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except _REDIS_DOWN:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def kill_redis(server: RedisServer, rng: random.Random, times: int, result: Result, stop: asyncio.Event) -> None:
    """SIGKILL Redis every 1-3 s and restart it (AOF) 0.1-1 s later."""
    for _ in range(times):
        await asyncio.sleep(rng.uniform(1, 3))
        if stop.is_set():
            return
        await asyncio.to_thread(server.kill)
        result.redis_kills += 1
        await asyncio.sleep(rng.uniform(0.1, 1))
        await asyncio.to_thread(server.start)


async def kill_clients(raw: Redis, rng: random.Random, times: int, result: Result, stop: asyncio.Event) -> None:
    """CLIENT KILL one connection at random, every 0.5-2 s."""
    for _ in range(times):
        await asyncio.sleep(rng.uniform(0.5, 2))
        if stop.is_set():
            return
        try:
            me = await raw.client_id()
            others = [c for c in await raw.client_list() if int(c["id"]) != me]
            if others:
                await raw.execute_command("CLIENT", "KILL", "ID", rng.choice(others)["id"])
                result.client_kills += 1
        except (*_REDIS_DOWN, ResponseError):
            pass


async def inject_proxy_faults(proxy: Any, rng: random.Random, times: int, result: Result, stop: asyncio.Event) -> None:
    """One fault of the proxy's every 0.5-2 s (see the module's docstring); counted when cancelled."""
    faults: Counter[str] = Counter()
    drops: list[tuple[str, Any]] = []
    try:
        for _ in range(times):
            await asyncio.sleep(rng.uniform(0.5, 2))
            if stop.is_set():
                break
            fault = rng.choice(["drop BLMPOP", "drop XREADGROUP", "drop EVALSHA", "reset", "silence", "delay"])
            faults[fault] += 1
            if fault.startswith("drop "):
                fired = await asyncio.to_thread(proxy.drop_next_reply, fault.split()[1].encode(), skip_empty=True)
                drops.append((fault, fired))
            elif fault == "reset":
                await asyncio.to_thread(proxy.reset)
            elif fault == "silence":
                await asyncio.to_thread(proxy.silence)
                await asyncio.sleep(rng.uniform(0.5, 2))
                await asyncio.to_thread(proxy.heal)
            else:
                await asyncio.to_thread(proxy.delay, rng.uniform(0.05, 0.2))
                await asyncio.sleep(rng.uniform(1, 2))
                await asyncio.to_thread(proxy.heal)
        await stop.wait()  # drops fire later: count them at the end
    finally:
        result.proxy_faults = dict(faults)
        for name, fired in drops:
            key = f"{name} fired"
            result.proxy_faults[key] = result.proxy_faults.get(key, 0) + fired.is_set()


async def soak(
    *, asks: int, kills: int, seed: int, providers: int = 3, concurrency: int = 64, lease_ttl: float = 1.0,
    ask_timeout: float = 120.0, progress: bool = False, redis_kills: int = 0, client_kills: int = 0,
    proxy: bool = False, proxy_faults: int = 0, keyed: int = 0, keyed_kills: int = 0,
) -> Result:  # fmt: skip
    rng = random.Random(seed)
    # kill when this many asks have been answered (distinct, so every holder answers some first)
    # (and early enough that asks are still in flight for each: the last `concurrency` asks can finish at once)
    thresholds = sorted(rng.sample(range(1, max(asks - 2 * concurrency, kills + 1)), kills)) if kills else []
    result = Result(asks=asks, keyed=keyed)
    keyed_rng = random.Random(seed + 2)
    killed_keys = set(keyed_rng.sample(range(keyed), min(keyed_kills, keyed)))
    namespace = f"soak-{seed}"
    with tempfile.TemporaryDirectory(prefix="qb-soak-") as tmp:
        durable = ("--appendonly", "yes", "--appendfsync", "everysec") if redis_kills else ()
        server = RedisServer(Path(tmp) / "redis", "--maxclients", "20000", *durable).start()
        fault_proxy = None
        url = server.url
        if proxy:
            from tests.faultproxy import FaultProxy  # a test helper: only with --proxy

            fault_proxy = FaultProxy(server.port).start()
            url = fault_proxy.url
        chaos_rng = random.Random(seed + 1)  # the kill thresholds above stay what they were
        chaos_stop = asyncio.Event()
        rules = Path(tmp) / "rules.toml"
        rules.write_text(RULES)
        holding = asyncio.Event()
        running: list[Provider] = []
        all_providers: list[Provider] = []
        audit_events: list[tuple[str, str, str]] = []
        audit_done = asyncio.Event()
        raw = Redis.from_url(server.url, decode_responses=True)

        async def start_provider() -> None:
            provider = await Provider.start(url, namespace, f"soak-{len(all_providers)}", rules, lease_ttl, holding)
            running.append(provider)
            all_providers.append(provider)

        try:
            for _ in range(providers):
                await start_provider()
            await asyncio.wait_for(holding.wait(), 30)
            # the answering side's audit and the askers' log (asked, attached, away) together
            audit = asyncio.gather(
                *(
                    follow_audit(raw, f"qb:{{{namespace}}}:{stream}", audit_events, audit_done)
                    for stream in ("audit", "asklog")
                )
            )
            chaos = []
            if redis_kills:
                chaos.append(asyncio.create_task(kill_redis(server, chaos_rng, redis_kills, result, chaos_stop)))
            if client_kills:
                chaos.append(asyncio.create_task(kill_clients(raw, chaos_rng, client_kills, result, chaos_stop)))
            if fault_proxy is not None and proxy_faults:
                chaos.append(
                    asyncio.create_task(inject_proxy_faults(fault_proxy, chaos_rng, proxy_faults, result, chaos_stop))
                )
            async with Broker(url, namespace, **KEYS) as broker:
                assert (broker.keys.audit, broker.keys.asklog) == (
                    f"qb:{{{namespace}}}:audit",
                    f"qb:{{{namespace}}}:asklog",
                )
                done = 0
                progressed = asyncio.Condition()
                gate = asyncio.Semaphore(concurrency)
                errors: Counter[str] = Counter()
                started = time.monotonic()

                # The last `concurrency` asks start only once every kill is made: a fast run must not
                # answer everything while the killer still waits for a takeover.
                held_back = max(0, asks - concurrency) if kills else asks
                kills_done = asyncio.Event()

                async def one(index: int) -> None:
                    nonlocal done
                    if index >= held_back:
                        await kills_done.wait()
                    async with gate:
                        asked_at = time.monotonic()
                        try:
                            answer = await broker.ask(request_for(index), timeout=ask_timeout)
                        except UserQuestionError as error:
                            errors[error.code] += 1
                            if error.code == "ASK_TIMED_OUT":
                                result.hung += 1
                            return
                        took = time.monotonic() - asked_at
                    result.slowest_answer = max(result.slowest_answer, round(took, 3))
                    if took >= 0.9 * ask_timeout:
                        result.answered_at_timeout += 1
                    result.answers += 1
                    if [item.selected for item in answer.answers] != [(f"ok-{index}",)]:
                        result.wrong_answers += 1
                    async with progressed:
                        done += 1
                        progressed.notify_all()

                async def killer() -> None:
                    floor = 0
                    for threshold in thresholds:
                        # at least one answer from each holder before its kill, unless held-back asks would be needed
                        target = min(max(threshold, floor + 1), held_back)
                        async with progressed:
                            while done < target:
                                await progressed.wait()
                        await asyncio.sleep(rng.uniform(0, 0.02))
                        alive = [p for p in running if p.alive]
                        if not alive:
                            continue  # every provider died by itself (counted as providers_died)
                        holder = max(alive, key=lambda p: p.epoch)
                        killed_at = time.monotonic()
                        holder.kill()
                        await holder.process.wait()
                        running.remove(holder)
                        result.kills += 1
                        floor = done
                        if progress:
                            print(f"soak: {done}/{asks} answered; killed {holder.name} (epoch {holder.epoch})",
                                  file=sys.stderr, flush=True)  # fmt: skip
                        await start_provider()
                        while not any(p.alive and p.epoch > holder.epoch for p in running):  # a standby took over
                            holding.clear()
                            await asyncio.wait_for(holding.wait(), 30)
                        result.takeover_seconds.append(round(time.monotonic() - killed_at, 3))

                async def kill_all() -> None:
                    try:
                        await killer()
                    finally:
                        kills_done.set()

                kill_task = asyncio.create_task(kill_all())
                keyed_gate = asyncio.Semaphore(8)  # asker processes starting at once

                async def one_keyed(index: int) -> None:
                    async with keyed_gate:
                        kill_after = keyed_rng.uniform(0.3, 1.5) if index in killed_keys else None
                        await keyed_asker(url, namespace, index, kill_after, result)

                await asyncio.gather(*(one(i) for i in range(asks)), *(one_keyed(i) for i in range(keyed)))
                if not kill_task.done():  # some asks failed, so a threshold was never reached
                    kill_task.cancel()
                await asyncio.gather(kill_task, return_exceptions=True)
                chaos_stop.set()
                for task in chaos:
                    task.cancel()
                await asyncio.gather(*chaos, return_exceptions=True)
                if server.process is None:
                    await asyncio.to_thread(server.start)  # cancelled between a kill and its restart
                if fault_proxy is not None:
                    await asyncio.to_thread(fault_proxy.heal)
                result.wall_seconds = time.monotonic() - started
                result.errors = dict(errors)
                result.stream_left = int(await patiently(lambda: raw.xlen(broker.keys.requests)))
                dead = [p for p in all_providers if not p.alive and not p.killed]
                result.providers_died = len(dead)
                result.died = [f"{p.name}: {p.notes[-1] if p.notes else '(nothing)'}" for p in dead]
                # lease acquisitions during the run (stopping the providers below hands the lease on again)
                result.failovers = max(0, len({p.epoch for p in all_providers if p.epoch}) - 1)
            audit_done.set()
            await audit
        finally:
            chaos_stop.set()
            for provider in running:
                await provider.stop()
            await raw.aclose()
            if fault_proxy is not None:
                fault_proxy.stop()
            server.kill()

    tally(result, audit_events)
    result.providers_started = len(all_providers)
    result.notes = [f"{p.name}: {note}" for p in all_providers for note in p.notes]
    return result


_BENIGN = ("asked", "answered", "delivered", "away", "back", "attached", "checkpoint")
"""audit events of a clean run (a keyed asker killed and restarted is away, then attached; providers seal the audit)"""


def tally(result: Result, audit_events: list[tuple[str, str, str]]) -> None:
    """Check the audit trail against the asks: every request asked once and answered once."""
    asked = Counter(rid for event, rid, _ in audit_events if event == "asked")
    answered = Counter(rid for event, rid, _ in audit_events if event == "answered")
    result.audit_asked = sum(asked.values())
    result.audit_answered = sum(answered.values())
    result.audit_other = dict(Counter(e for e, _, _ in audit_events if e not in _BENIGN))
    result.duplicates = sum(n - 1 for n in answered.values() if n > 1) + sum(n - 1 for n in asked.values() if n > 1)
    unanswered = set(asked) - set(answered)
    keyed_asks = Counter(agent for event, _, agent in audit_events if event == "asked" and agent.startswith("keyed-"))
    result.keyed_asked_twice = sum(1 for n in keyed_asks.values() if n > 1)
    total = result.asks + result.keyed
    result.lost = max(total - result.answers - result.keyed_answers, len(unanswered), total - len(asked))
    result.epochs = sorted({int(epoch) for event, _, epoch in audit_events if event == "answered" and epoch})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--asks", type=int, default=5000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--providers", type=int, default=3, help="qbroker auto processes running at once")
    parser.add_argument("--concurrency", type=int, default=64, help="asks waiting at once")
    parser.add_argument("--lease-ttl", type=float, default=1.0)
    parser.add_argument("--ask-timeout", type=float, default=120.0, help="each ask's own timeout (then: hung)")
    parser.add_argument("--redis-kills", type=int, default=0, help="SIGKILL Redis (AOF everysec) this many times")
    parser.add_argument("--client-kills", type=int, default=0, help="CLIENT KILL a random connection this many times")
    parser.add_argument("--proxy", action="store_true", help="route the asker and providers through a fault proxy")
    parser.add_argument("--proxy-faults", type=int, default=0, help="with --proxy: inject this many faults")
    parser.add_argument("--keyed", type=int, default=0, help="also run this many `qbroker ask --key` processes")
    parser.add_argument("--keyed-kills", type=int, default=0, help="SIGKILL this many of them mid-question, then rerun")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the providers' lease lines")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    if not 0 <= args.kills < args.asks or args.providers < 2:
        parser.error("need 0 <= kills < asks and at least 2 providers")
    if args.proxy_faults and not args.proxy:
        parser.error("--proxy-faults needs --proxy")
    result = asyncio.run(
        soak(
            asks=args.asks, kills=args.kills, seed=args.seed, providers=args.providers,
            concurrency=args.concurrency, lease_ttl=args.lease_ttl, progress=not args.json,
            ask_timeout=args.ask_timeout, redis_kills=args.redis_kills, client_kills=args.client_kills,
            proxy=args.proxy, proxy_faults=args.proxy_faults, keyed=args.keyed, keyed_kills=args.keyed_kills,
        )
    )  # fmt: skip
    if args.json:
        print(json.dumps(asdict(result) | {"ok": result.ok}))
    else:
        rate = result.asks / result.wall_seconds if result.wall_seconds else 0.0
        times = result.takeover_seconds
        takeover = (
            f"min {min(times):.2f}s, mean {sum(times) / len(times):.2f}s, max {max(times):.2f}s" if times else "-"
        )
        print(
            f"asks {result.asks}  answers {result.answers}  kills {result.kills}  failovers {result.failovers}  "
            f"duplicates {result.duplicates}  lost {result.lost}  wall {result.wall_seconds:.1f}s ({rate:.0f} asks/s)\n"
            f"takeover after a kill: {takeover}\n"
            f"audit: asked {result.audit_asked}, answered {result.audit_answered}, "
            f"other {result.audit_other or 'none'}; answering epochs {len(result.epochs)}; "
            f"errors {result.errors or 'none'}; wrong answers {result.wrong_answers}; "
            f"requests stream left {result.stream_left}; providers started {result.providers_started}"
        )
        if result.redis_kills or result.client_kills or result.proxy_faults or result.hung or result.providers_died:
            print(
                f"redis kills {result.redis_kills}  client kills {result.client_kills}  "
                f"proxy faults {result.proxy_faults or 'none'}\n"
                f"hung {result.hung}  answered only at their timeout {result.answered_at_timeout}  "
                f"slowest answer {result.slowest_answer:.1f}s  providers died {result.providers_died}"
            )
        if result.keyed:
            print(
                f"keyed asks {result.keyed}  answered {result.keyed_answers}  killed mid-question and rerun "
                f"{result.keyed_kills}  wrong {result.keyed_wrong}  asked twice {result.keyed_asked_twice}  "
                f"failed {result.keyed_failed or 'none'}"
            )
        if args.verbose:
            print("\n".join(result.notes))
        elif result.providers_died:
            print("providers that died: " + "; ".join(result.died))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
