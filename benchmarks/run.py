"""The orchestrator: one private redis-server, the roles as processes, the report.

``python -m benchmarks [--quick] [--concurrency 1,16,256,1024] [--asks N] ...``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from benchmarks.keys import KEYS
from workers.redis_server import RedisServer

from . import options
from .processes import stop_process
from .report import machine, render_table, targets, verdict, write_doc

ROOT = Path(__file__).resolve().parent.parent
LINE_TIMEOUT = 180.0

PAIRS = {
    "broker": ("broker-provider", "broker-asker"),
    "broker-serial": ("broker-provider", "broker-asker"),
    "broker-keyed": ("broker-provider", "broker-asker"),
    "broker-no-remember": ("broker-provider", "broker-asker"),
    "broker-decided": ("broker-provider", "broker-asker"),
    "broker-no-coalesce": ("broker-provider", "broker-asker"),
    "broker-priorities": ("broker-provider", "broker-asker"),
    "broker-unsigned": ("broker-provider", "broker-asker"),
    "floor": ("floor-server", "floor-asker"),
    "arq": ("arq-worker", "arq-asker"),
}
ASKER_FLAGS = {
    "broker-keyed": ("--keyed",),
    "broker-no-remember": ("--no-remember",),
    "broker-no-coalesce": ("--no-coalesce",),
    "broker-priorities": ("--priorities",),
    "broker-unsigned": ("--unsigned",),
}
"""what a broker variant's asking process is started with"""
SERVER_FLAGS = {
    "broker-serial": ("--serial",),
    "broker-decided": ("--remember",),  # its first answer decides every later ask
    "broker-unsigned": ("--unsigned",),
}
"""what a broker variant's providing process is started with"""


WIRE_FIELDS = ("total_net_input_bytes", "total_net_output_bytes", "total_reads_processed", "total_writes_processed")
"""INFO stats counters that do not depend on load: Redis's bytes in and out, and its socket reads and writes"""


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Proc:
    """One role process; its JSON lines are read with ``expect``."""

    def __init__(self, process: asyncio.subprocess.Process, name: str, stderr_path: Path) -> None:
        self.process = process
        self.name = name
        self.stderr_path = stderr_path

    @classmethod
    async def start(
        cls, workdir: Path, role: str, *args: str, stdin: bool = False, prefix: list[str] | None = None
    ) -> Proc:
        stderr_path = workdir / f"{role}-{time.monotonic_ns()}.stderr"
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *(prefix or []),
                sys.executable,
                "-m",
                "benchmarks.roles",
                role,
                *args,
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        return cls(process, role, stderr_path)

    async def next(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = await asyncio.wait_for(self.process.stdout.readline(), LINE_TIMEOUT)
            if not line:
                await self.process.wait()
                tail = self.stderr_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.name} exited ({self.process.returncode}) early:\n{tail}")
            if line.startswith(b"{"):
                event: dict[str, Any] = json.loads(line)
                return event

    async def expect(self, event: str) -> dict[str, Any]:
        while True:
            got = await self.next()
            if got["event"] == event:
                return got

    def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode())

    async def stop(self, sig: str = "term") -> None:
        await stop_process(self.process, grace=15, kill=sig == "kill")


class Bench:
    def __init__(self, args: argparse.Namespace, server: RedisServer, workdir: Path) -> None:
        self.args = args
        self.url = server.url
        self.workdir = workdir
        self.redis = Redis.from_url(server.url, decode_responses=True)
        self.procs: list[Proc] = []
        self.commandstats: dict[str, dict[str, dict[str, int]]] = {}
        self.commandstats_asks: dict[str, int] = {}
        # bytes on the wire and socket reads/writes (about one per round trip) per system, from INFO stats
        self.wire: dict[str, dict[str, int]] = {}

    async def start(self, role: str, namespace: str, *extra: str, url: str | None = None, **kw: Any) -> Proc:
        url = url or self.url
        proc = await Proc.start(self.workdir, role, "--url", url, "--namespace", namespace, *extra, **kw)
        self.procs.append(proc)
        return proc

    async def close(self) -> None:
        for proc in self.procs:
            await proc.stop("kill")
        await self.redis.aclose()

    # -- throughput and latency ----------------------------------------------------------

    async def throughput(self, system: str, round_number: int = 0) -> list[dict[str, Any]]:
        args = self.args
        server_role, asker_role = PAIRS[system]
        await self.redis.config_resetstat()
        namespace = f"bench-{system}-{round_number}"
        common = ["--poll-delay", str(args.arq_poll_delay), "--max-jobs", str(args.arq_max_jobs)]
        server = await self.start(server_role, namespace, *common, *SERVER_FLAGS.get(system, ()))
        await server.expect("holding")
        levels = ",".join(str(c) for c in args.concurrency)
        asker = await self.start(
            asker_role,
            namespace,
            *common,
            "--levels", levels,
            "--asks", str(args.asks),
            "--max-seconds", str(args.max_seconds),
            "--min-seconds", str(args.min_seconds),
            *ASKER_FLAGS.get(system, ()),
        )  # fmt: skip
        profilers: list[asyncio.subprocess.Process] = []
        # CPU per ask counts from the end of the warm-up: start-up and imports are not asks.
        await asker.expect("warmed")
        if args.profile and system == "broker":
            await asyncio.to_thread(Path(args.profile).mkdir, parents=True, exist_ok=True)
            seconds = max(1, int(args.max_seconds * len(args.concurrency)))
            for proc, name in ((asker, "asker"), (server, "provider")):
                profilers.append(await _py_spy(proc.process.pid, Path(args.profile) / f"{name}.txt", seconds))
        results: list[dict[str, Any]] = []
        before = await self._cpu(asker, server)
        while True:
            event = await asker.next()
            if event["event"] == "level":
                event.pop("event")
                after = await self._cpu(asker, server)
                # CPU ms per ask, by process, over this level only
                for part in ("asker", "answerer", "redis"):
                    event[f"cpu_{part}_ms"] = (after[part] - before[part]) * 1000 / max(1, event["asks"])
                before = after
                results.append(event)
                log(
                    f"{system:13} c={event['concurrency']:<5} {event['rate']:9.0f} asks/s  "
                    f"p50 {event['p50_ms']:.2f} ms  p99 {event['p99_ms']:.2f} ms  ({event['asks']} asks; CPU ms/ask: "
                    f"asker {event['cpu_asker_ms']:.3f}, answerer {event['cpu_answerer_ms']:.3f}, "
                    f"redis {event['cpu_redis_ms']:.3f})"
                )
            elif event["event"] == "done":
                break
        await asker.process.wait()
        for profiler in profilers:
            await profiler.wait()
        await server.stop()
        wire = await self.redis.info("stats")
        counted = self.wire.setdefault(system, {})
        for field in WIRE_FIELDS:
            counted[field] = counted.get(field, 0) + int(wire.get(field, 0))
        stats = await self.redis.info("commandstats")
        merged = self.commandstats.setdefault(system, {})
        for name, v in stats.items():
            if not name.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_client")):
                stat = merged.setdefault(name.removeprefix("cmdstat_"), {"calls": 0, "usec": 0})
                stat["calls"] += int(v["calls"])
                stat["usec"] += int(v["usec"])
        self.commandstats_asks[system] = self.commandstats_asks.get(system, 0) + 50 + sum(r["asks"] for r in results)
        return results

    async def _cpu(self, asker: Proc, answerer: Proc) -> dict[str, float]:
        info = await self.redis.info("cpu")
        return {
            "asker": _process_cpu(asker.process.pid),
            "answerer": _process_cpu(answerer.process.pid),
            "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        }

    # -- scale-out on a Redis Cluster ----------------------------------------------------

    async def scale_out(self) -> dict[str, Any]:
        """Aggregate asks/s of three namespaces on a three-master Cluster (one namespace per master,
        each with its own asking and providing process) against one namespace on one Redis.

        Every process shares this machine's cores, so on a small machine this measures the
        cluster's overhead (client routing, three servers and six processes on the same cores),
        not the gain that three machines would give.
        """
        from tests.cluster import RedisClusterFixture

        args = self.args
        concurrency = 256 if 256 in args.concurrency else max(args.concurrency)
        singles: list[dict[str, Any]] = []
        spreads: list[dict[str, Any]] = []
        cluster = await asyncio.to_thread(RedisClusterFixture(self.workdir / "cluster").start)
        try:
            for number in range(args.rounds):  # in turn, each side's best round kept (the machine is shared)
                singles.append(await self._namespaces(self.url, [f"bench-scale-single-{number}"], concurrency))
                namespaces = await asyncio.to_thread(_one_namespace_per_master, cluster, f"bench-scale-{number}-")
                spreads.append(await self._namespaces(cluster.url, namespaces, concurrency))
        finally:
            await asyncio.to_thread(cluster.kill)
        single = max(singles, key=lambda run: float(run["rate"]))
        spread = max(spreads, key=lambda run: float(run["rate"]))
        result = {
            "concurrency": concurrency,
            "single": single,
            "cluster": spread,
            "rounds": {"single": singles, "cluster": spreads},
            "cluster_masters": 3,
            "single_rate": single["rate"],
            "cluster_rate": spread["rate"],
        }
        result["ratio"] = result["cluster_rate"] / result["single_rate"] if result["single_rate"] else 0.0
        log(
            f"scale-out: 3 namespaces on a 3-master cluster {result['cluster_rate']:.0f} asks/s vs one namespace "
            f"on one Redis {result['single_rate']:.0f} asks/s = {result['ratio']:.2f}x"
        )
        return result

    async def _namespaces(self, url: str, namespaces: list[str], concurrency: int) -> dict[str, Any]:
        """One provider and one asker per namespace, all at once; each asker's level result."""
        args = self.args
        providers = [await self.start("broker-provider", ns, url=url) for ns in namespaces]
        for provider in providers:
            await provider.expect("holding")
        levels_args = ["--levels", str(concurrency), "--asks", str(args.asks)]
        levels_args += ["--max-seconds", str(args.max_seconds), "--min-seconds", str(args.min_seconds)]
        askers = [await self.start("broker-asker", ns, *levels_args, url=url) for ns in namespaces]

        async def level(asker: Proc) -> tuple[dict[str, Any], float, float]:
            await asker.expect("warmed")
            started = time.perf_counter()
            result = await asker.expect("level")
            result.pop("event")
            return result, started, time.perf_counter()

        ran = await asyncio.gather(*(level(asker) for asker in askers))
        for proc in (*askers, *providers):
            await proc.stop()
        # From the first asker's start to the last one's end: the askers' own windows do not quite
        # coincide, so this aggregate is a lower bound rather than the sum of their rates.
        window = max(end for _, _, end in ran) - min(start for _, start, _ in ran)
        levels = [result for result, _, _ in ran]
        return {"levels": levels, "asks": sum(r["asks"] for r in levels), "seconds": window,
                "rate": sum(r["asks"] for r in levels) / window}  # fmt: skip

    # -- connections, memory and residue -------------------------------------------------

    async def waiting(self) -> dict[str, Any]:
        args = self.args
        namespace = "bench-waiting"
        prefix = f"qb:{{{namespace}}}:"
        # The throughput runs are over: their keys (slim request tombstones expire 60 s after each
        # answer) would free memory while this measures it.
        await self.redis.flushdb()
        holder = await self.start("broker-holder", namespace, "--lease-ttl", "10")
        await holder.expect("holding")
        clients_before = len(await self.redis.client_list())
        asker = await self.start("broker-waiting-asker", namespace, "--waiting", str(args.waiting), stdin=True)
        await asker.expect("ready")
        await asyncio.sleep(1.0)  # let clientsCron settle buffers before the baseline
        keys_before = await self._keys(prefix)
        memory_before = await self._used_memory()
        log(f"waiting: starting {args.waiting} asks with a provider that answers nothing")
        asker.send("go\n")
        await asker.expect("started")
        stream = prefix + "requests"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            length = await self.redis.xlen(stream)
            pending = (await self.redis.xpending(stream, "providers"))["pending"] if length else 0
            if length >= args.waiting and pending >= args.waiting:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)
        clients = await self.redis.client_list()
        asker_connections = len(clients) - clients_before
        memory_pending = await self._used_memory()
        per_key = await self._sample_sizes(prefix, args.waiting)
        per_ask = (memory_pending - memory_before) / args.waiting
        log(f"waiting: {asker_connections} connections held by the asker; {per_ask:.0f} B of used_memory per ask")

        await holder.stop()  # a clean exit releases the lease at once
        answerer = await self.start("broker-provider", namespace, "--lease-ttl", "10")
        await answerer.expect("holding")
        answered = await asker.expect("answered")
        await asyncio.sleep(1.0)
        residue_open, tombstones_open = await self._residue(await self._keys(prefix))
        asker.send("close\n")
        await asker.expect("done")
        await asker.process.wait()
        await answerer.stop()
        await asyncio.sleep(1.0)
        keys_after = await self._keys(prefix)
        per_request, tombstones = await self._residue(keys_after)
        left = {k: v for k, v in keys_after.items() if k not in keys_before}
        log(f"residue: {len(residue_open)} per-request keys with the asker open, {len(per_request)} after it closed")
        memory_after = await self._used_memory()
        return {
            "asks": args.waiting,
            "asker_connections": asker_connections,
            "clients_total": len(clients),
            "used_memory_before": memory_before,
            "used_memory_pending": memory_pending,
            "used_memory_after": memory_after,
            "per_ask_bytes": per_ask,
            "per_key": per_key,
            "all_answered": answered["asks"] == args.waiting and answered["all_yes"],
            "residue_open_keys": len(residue_open),
            "residue_open_bytes": sum(residue_open.values()),
            "tombstones_open": len(tombstones_open),
            "tombstones": len(tombstones),
            "tombstone_bytes": sum(tombstones.values()),
            "residue_keys": len(per_request),
            "residue_bytes": sum(per_request.values()),
            "residue_sample": sorted(per_request)[:5],
            "new_keys_after": {_short(k, prefix): v for k, v in sorted(left.items())},
            "namespace_keys_after": {_short(k, prefix): v for k, v in sorted(keys_after.items())},
        }

    async def _residue(self, keys: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """(per-request keys left, slim tombstones): a settled request's hash keeps only its
        state and settle call id for TOMBSTONE_MS (60 s) so that a retried settle is recognised."""
        residue: dict[str, int] = {}
        tombstones: dict[str, int] = {}
        for key, size in _per_request(keys).items():
            tombstone = ":req:" in key and not await self.redis.hexists(key, "request")
            (tombstones if tombstone else residue)[key] = size
        return residue, tombstones

    async def _used_memory(self) -> int:
        return int((await self.redis.info("memory"))["used_memory"])

    async def _keys(self, prefix: str) -> dict[str, int]:
        sizes: dict[str, int] = {}
        async for key in self.redis.scan_iter(match=_escape(prefix) + "*", count=1000):
            sizes[key] = int(await self.redis.memory_usage(key, samples=0) or 0)
        return sizes

    async def _sample_sizes(self, prefix: str, asks: int) -> dict[str, float]:
        """MEMORY USAGE of one request hash and the streams' share per ask."""
        sample = None
        async for key in self.redis.scan_iter(match=_escape(prefix) + "req:*", count=100):
            sample = key
            break
        request_hash = int(await self.redis.memory_usage(sample, samples=0) or 0) if sample else 0
        stream = int(await self.redis.memory_usage(prefix + "requests", samples=0) or 0)
        audit = int(await self.redis.memory_usage(prefix + "audit", samples=0) or 0)
        audit_len = await self.redis.xlen(prefix + "audit")
        return {
            "request_hash": request_hash,
            "requests_stream_per_ask": stream / asks,
            "audit_per_entry": audit / audit_len if audit_len else 0.0,
            "audit_entries": audit_len,
        }

    # -- failover ------------------------------------------------------------------------

    async def failover(self) -> dict[str, Any]:
        from broker import Broker

        from .roles import REQUEST

        args = self.args
        namespace = "bench-failover"
        ttl = str(args.lease_ttl)
        holder = await self.start("broker-provider", namespace, "--lease-ttl", ttl, "--name", "p0")
        await holder.expect("holding")
        times: list[float] = []
        async with Broker(self.url, namespace, **KEYS) as broker:
            await broker.ask(REQUEST, timeout=30)
            for run in range(args.failover_runs):
                standby = await self.start("broker-provider", namespace, "--lease-ttl", ttl, "--name", f"p{run + 1}")
                await standby.expect("standby")
                await asyncio.sleep(random.uniform(0, args.lease_ttl / 3))  # any phase of the renewal cycle
                await holder.stop("kill")
                killed = time.perf_counter()
                await broker.ask(REQUEST, timeout=args.lease_ttl * 3 + 30)
                times.append(time.perf_counter() - killed)
                log(f"failover run {run + 1}: {times[-1]:.2f} s (lease TTL {args.lease_ttl:g} s)")
                await standby.expect("holding")
                holder = standby
        await holder.stop()
        return {"lease_ttl": args.lease_ttl, "runs": times, "median": statistics.median(times)}

    # -- the command line ----------------------------------------------------------------

    async def cli(self, runs: int = 5) -> dict[str, Any]:
        """Wall time of `qbroker ask` (a new process each time) against a running `qbroker auto`."""
        namespace = "bench-cli"
        rules = self.workdir / "rules.toml"
        rules.write_text("[default]\nfirst = true\n")
        shared = ["--redis-url", self.url, "--namespace", namespace]
        cli = [sys.executable, "-m", "workers.cli"]
        auto = await asyncio.create_subprocess_exec(
            *cli, *shared, "auto", "--rules", str(rules), cwd=ROOT,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        times: list[float] = []
        try:
            deadline = time.monotonic() + 30
            while not await self.redis.exists(f"qb:{{{namespace}}}:provider"):
                if time.monotonic() > deadline:
                    raise RuntimeError("qbroker auto did not take the lease within 30 s")
                await asyncio.sleep(0.1)
            for _ in range(runs):
                started = time.perf_counter()
                ask = await asyncio.create_subprocess_exec(
                    *cli, *shared, "ask", "--question", "Go?", "--option", "yes", "--option", "no", cwd=ROOT,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                out, err = await ask.communicate()
                times.append(time.perf_counter() - started)
                if ask.returncode != 0 or b'"yes"' not in out:
                    raise RuntimeError(f"qbroker ask failed ({ask.returncode}): {err.decode()[-2000:]}")
            log(f"qbroker ask: median {statistics.median(times):.3f} s over {runs} runs")
        finally:
            auto.terminate()
            await auto.wait()
        return {"runs": times, "median": statistics.median(times)}


def _one_namespace_per_master(cluster: Any, prefix: str) -> list[str]:
    """Three namespace names whose slots (the hash tag of every key) are served by three different masters."""
    from redis.crc import key_slot

    by_port: dict[int, str] = {}
    for n in range(10_000):
        namespace = f"{prefix}{n}"
        port = cluster.port_of_slot(key_slot(namespace.encode()))
        by_port.setdefault(port, namespace)
        if len(by_port) == 3:
            return sorted(by_port.values())
    raise RuntimeError("could not place a namespace on every master")


def _best(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per concurrency level, the round with the highest rate (the machine is shared: others add noise)."""
    best: dict[int, dict[str, Any]] = {}
    for run in runs:
        for level in run:
            known = best.get(level["concurrency"])
            if known is None or level["rate"] > known["rate"]:
                best[level["concurrency"]] = level
    return [best[c] for c in sorted(best)]


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc), 0 where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _per_request(keys: dict[str, int]) -> dict[str, int]:
    """The keys that belong to one request (or to its asker's inbox of notices)."""
    return {k: v for k, v in keys.items() if any(f":{kind}:" in k for kind in ("req", "ans", "inbox"))}


def _escape(prefix: str) -> str:
    return prefix.replace("{", "\\{").replace("}", "\\}")


def _short(key: str, prefix: str) -> str:
    return key[len(prefix) :] if key.startswith(prefix) else key


async def _py_spy(pid: int, output: Path, seconds: int) -> asyncio.subprocess.Process:
    """Attach py-spy to a running role (collapsed stacks, for shares by function)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args = ["record", "--pid", str(pid), "--duration", str(seconds), "--rate", "250", "--format", "raw"]
    return await asyncio.create_subprocess_exec(
        py_spy, *args, "--output", str(output), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="qb-bench-") as tmp:
        workdir = Path(tmp)
        server = RedisServer(workdir / "redis", "--maxclients", "20000").start()
        runner = Bench(args, server, workdir)
        try:
            info = await runner.redis.info("server")
            results: dict[str, Any] = {
                "args": {k: v for k, v in vars(args).items() if k != "func"},
                "redis_version": info["redis_version"],
                "machine": machine(),
                "load_before": os.getloadavg(),
                "throughput": {},
            }
            rounds: dict[str, list[list[dict[str, Any]]]] = {system: [] for system in args.systems}
            for number in range(args.rounds):
                if args.rounds > 1:
                    log(f"round {number + 1} of {args.rounds}")
                for system in args.systems:
                    rounds[system].append(await runner.throughput(system, number))
            results["throughput"] = {system: _best(runs) for system, runs in rounds.items()}
            results["rounds"] = rounds
            results["commandstats"] = runner.commandstats
            results["commandstats_asks"] = runner.commandstats_asks
            results["wire"] = runner.wire
            if not args.skip_extras:
                results["waiting"] = await runner.waiting()
                results["failover"] = await runner.failover()
                results["cli"] = await runner.cli()
                results["scale_out"] = await runner.scale_out()
            results["load_after"] = os.getloadavg()
            results["seconds"] = time.time() - started
            results["finished_utc"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        finally:
            await runner.close()
            server.kill()
    return results


async def run(args: argparse.Namespace) -> int:
    args = options.resolve(args)
    if args.from_json:
        results = json.loads(await asyncio.to_thread(Path(args.from_json).read_text))
        args.quick = results["args"]["quick"]
    else:
        results = await bench(args)
    if args.json:
        text = json.dumps(results, indent=2, default=str)
        await asyncio.to_thread(Path(args.json).write_text, text)
    print(render_table(results))
    checks = targets(results)
    print()
    for check in checks:
        said = verdict(check).upper()
        print(f"[{said}] {check['target']}: {check['measured']}")
    if args.quick:
        print("(quick run: sizes too small for the figures to mean much)")
    before = None
    if args.before:
        before = json.loads(await asyncio.to_thread(Path(args.before).read_text))
    if args.doc:
        path = write_doc(results, checks, Path(args.doc), before)
        print(f"\nwrote {path} and {path.with_name('benchmarks-throughput.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    options.add_arguments(parser)
    return asyncio.run(run(parser.parse_args(argv)))
