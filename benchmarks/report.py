"""The table, the targets of issue 12, and docs/benchmarks.md with its plot."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from .options import SYSTEMS

_BROKERS = tuple(system for system in SYSTEMS if system.startswith("broker"))
"""the broker's own variants: not compared with the broker"""
LABELS = {
    "broker": "question-broker",
    "floor": "raw floor",
    "arq": "arq",
    "broker-serial": "broker, serial answers",
    "broker-keyed": "broker, keyed asks",
    "broker-no-remember": "broker, remember=False",
    "broker-decided": "broker, answered by a decision",
    "broker-no-coalesce": "broker, coalesce=False",
    "broker-priorities": "broker, 3 agents x 3 priorities",
    "broker-unsigned": "broker, unsigned (counterfactual)",
}


def _level(results: dict[str, Any], system: str, concurrency: int) -> dict[str, Any] | None:
    for level in results["throughput"].get(system, ()):
        if level["concurrency"] == concurrency:
            return level
    return None


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> str:
    if a is None or b is None or not b[key]:
        return "-"
    return f"{a[key] / b[key]:.2f}x"


def render_table(results: dict[str, Any]) -> str:
    """A Markdown table: one row per concurrency, every system side by side, then ratios."""
    systems = list(results["throughput"])
    header = ["concurrency"]
    for system in systems:
        header += [f"{LABELS[system]} asks/s", "p50 ms", "p99 ms"]
    if "broker" in systems:
        header += [f"broker/{LABELS[s]} asks/s" for s in systems if s not in _BROKERS]
    rows = [header, ["---:"] * len(header)]
    levels = sorted({lvl["concurrency"] for s in systems for lvl in results["throughput"][s]})
    for concurrency in levels:
        row = [str(concurrency)]
        for system in systems:
            lvl = _level(results, system, concurrency)
            row += (
                ["-", "-", "-"]
                if lvl is None
                else [f"{lvl['rate']:.0f}", f"{lvl['p50_ms']:.2f}", f"{lvl['p99_ms']:.2f}"]
            )
        if "broker" in systems:
            broker = _level(results, "broker", concurrency)
            row += [_ratio(broker, _level(results, s, concurrency), "rate") for s in systems if s not in _BROKERS]
        rows.append(row)
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def render_cpu(results: dict[str, Any]) -> str:
    """CPU milliseconds per ask by process: who the limit is."""
    rows = [
        ["system", "concurrency", "asks/s", "asker CPU ms/ask", "answerer CPU ms/ask", "redis CPU ms/ask", "total"],
        ["---", "---:", "---:", "---:", "---:", "---:", "---:"],
    ]
    for system, levels in results["throughput"].items():
        for lvl in levels:
            if "cpu_asker_ms" not in lvl:
                continue
            rows.append(
                [
                    LABELS[system],
                    str(lvl["concurrency"]),
                    f"{lvl['rate']:.0f}",
                    f"{lvl['cpu_asker_ms']:.3f}",
                    f"{lvl['cpu_answerer_ms']:.3f}",
                    f"{lvl['cpu_redis_ms']:.3f}",
                    f"{cpu_total(lvl):.3f}",
                ]
            )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def render_commandstats(results: dict[str, Any], top: int = 8) -> str:
    """Redis CPU by command over each system's whole run (INFO commandstats), per ask."""
    rows = [
        ["system", "command", "calls per ask", "Redis us per ask", "us per call"],
        ["---", "---", "---:", "---:", "---:"],
    ]
    for system, stats in results.get("commandstats", {}).items():
        asks = results["commandstats_asks"][system]
        ranked = sorted(stats.items(), key=lambda item: -item[1]["usec"])[:top]
        for name, stat in ranked:
            per_call = stat["usec"] / stat["calls"] if stat["calls"] else 0.0
            rows.append(
                [
                    LABELS[system],
                    name,
                    f"{stat['calls'] / asks:.2f}",
                    f"{stat['usec'] / asks:.1f}",
                    f"{per_call:.1f}",
                ]
            )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def _check(target: str, measured: str | None, met: bool | None) -> dict[str, Any]:
    return {"target": target, "measured": measured or "not measured", "met": met if measured else None}


def _compared(
    ours: dict[str, Any] | None, theirs: dict[str, Any] | None, figure: str, unit: str, digits: int
) -> tuple[float, str | None]:
    """One figure of two levels: ours over theirs, and the measurement as a target states it
    (0.0 and None where either level was not measured or ours is zero)."""
    if not ours or not theirs:
        return 0.0, None
    ratio = ours[figure] / theirs[figure]
    return ratio, f"{ours[figure]:.{digits}f} vs {theirs[figure]:.{digits}f} {unit} = {ratio:.2f}x" if ratio else None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of issue 12 with the measured figure and whether it is met (None: not measured)."""
    checks: list[dict[str, Any]] = []
    broker256, floor256, arq256 = (_level(results, s, 256) for s in ("broker", "floor", "arq"))
    ratio, measured = _compared(broker256, floor256, "rate", "asks/s", 0)
    checks.append(_check("throughput at c=256 >= 0.35x the fair raw floor", measured, ratio >= 0.35))
    checks.append(_check("stretch: throughput at c=256 >= 0.5x the fair raw floor", measured, ratio >= 0.5))
    ratio, measured = _compared(broker256, arq256, "rate", "asks/s", 0)
    checks.append(_check("throughput at c=256 >= 5x arq", measured, ratio >= 5))
    broker1, floor1 = _level(results, "broker", 1), _level(results, "floor", 1)
    ratio, measured = _compared(broker1, floor1, "p50_ms", "ms", 2)
    checks.append(_check("p50 latency at c=1 <= 2.0x the fair raw floor", measured, ratio <= 2.0))
    total = cpu_total(broker256) if broker256 else None
    measured = None
    if broker256 and total is not None:
        measured = (
            f"{total:.3f} ms (asker {broker256['cpu_asker_ms']:.3f} + provider {broker256['cpu_answerer_ms']:.3f}"
            f" + Redis {broker256['cpu_redis_ms']:.3f})"
        )
    checks.append(_check("total CPU per ask at c=256 <= 0.25 ms", measured, total is not None and total <= 0.25))
    off256, decided256 = _level(results, "broker-no-remember", 256), _level(results, "broker-decided", 256)
    if broker256 and off256:  # remembered decisions: the lookup every ask now makes (a miss)
        cost = 1 - broker256["rate"] / off256["rate"]
        measured = f"{broker256['rate']:.0f} vs {off256['rate']:.0f} asks/s with remember=False = {cost:+.1%}"
        checks.append(_check("remembered decisions cost asks that miss < 10% at c=256", measured, cost < 0.10))
    if decided256 and off256:
        measured = f"{decided256['rate']:.0f} asks/s answered by a decision vs {off256['rate']:.0f} asked of a human"
        checks.append(_check("an ask answered by a decision is no slower at c=256", measured,
                             decided256["rate"] >= 0.9 * off256["rate"]))  # fmt: skip
    solo256, mixed256 = _level(results, "broker-no-coalesce", 256), _level(results, "broker-priorities", 256)
    if broker256 and solo256:  # coalescing: the request fingerprint the provider takes of every delivered ask
        cost = 1 - broker256["rate"] / solo256["rate"]
        measured = f"{broker256['rate']:.0f} vs {solo256['rate']:.0f} asks/s with coalesce=False = {cost:+.1%}"
        checks.append(_check("coalescing costs < 10% at c=256", measured, cost < 0.10))
    if broker256 and mixed256:  # priorities: three agents' asks cycling three levels through the schedule
        cost = 1 - mixed256["rate"] / broker256["rate"]
        measured = f"{mixed256['rate']:.0f} asks/s (3 agents x 3 priorities) vs {broker256['rate']:.0f} = {cost:+.1%}"
        checks.append(_check("priorities and fairness cost < 10% at c=256", measured, cost < 0.10))
    checks += _signing_checks(results)
    scale = results.get("scale_out")
    checks.append(
        {
            "target": "scale out: three namespaces on a three-master Cluster vs one namespace on one Redis "
            "(aggregate asks/s; reported, no threshold)",
            "measured": (
                f"{scale['cluster_rate']:.0f} vs {scale['single_rate']:.0f} asks/s at c={scale['concurrency']} "
                f"per namespace = {scale['ratio']:.2f}x"
                if scale
                else "not measured"
            ),
            "met": None,
            "reported": bool(scale),
        }
    )
    cli = results.get("cli")
    measured = f"median {cli['median']:.2f} s over {len(cli['runs'])} runs" if cli else None
    fast = bool(cli and cli["median"] <= 0.3)
    checks.append(_check("`qbroker ask` against a running `qbroker auto` <= 0.3 s wall", measured, fast))
    waiting = results.get("waiting")
    failover = results.get("failover")
    if waiting:
        n = waiting["asks"]
        checks.append(
            {
                "target": f"<= 4 Redis connections per asking process with {n} asks waiting",
                "measured": f"{waiting['asker_connections']} connections",
                "met": waiting["asker_connections"] <= 4,
            }
        )
        checks.append(
            {
                "target": "<= 2 KiB of Redis used_memory per pending one-question ask",
                "measured": f"{waiting['per_ask_bytes']:.0f} B per ask ({n} asks)",
                "met": waiting["per_ask_bytes"] <= 2048,
            }
        )
        checks.append(
            {
                "target": "zero residue after all asks are answered (per-request keys)",
                "measured": f"{waiting['residue_open_keys']} keys, {waiting['residue_open_bytes']} B with the asker "
                f"open; {waiting['residue_keys']} keys, {waiting['residue_bytes']} B after it closed"
                + ("" if waiting["all_answered"] else " (NOT all answered)"),
                "met": waiting["residue_keys"] == 0 and waiting["residue_open_keys"] == 0 and waiting["all_answered"],
            }
        )
    if failover:
        checks.append(
            {
                "target": "failover <= lease TTL + 1 s",
                "measured": f"median {failover['median']:.2f} s over {len(failover['runs'])} runs, "
                f"lease TTL {failover['lease_ttl']:g} s",
                "met": failover["median"] <= failover["lease_ttl"] + 1,
            }
        )
    return checks


def _paired_ratios(results: dict[str, Any], system: str, other: str, concurrency: int, key: str) -> list[float]:
    """``system`` over ``other`` in each round, the two measured one after the other (the machine is shared)."""
    ratios = []
    rounds = results.get("rounds", {})
    for mine, theirs in zip(rounds.get(system, ()), rounds.get(other, ()), strict=False):
        a = next((lvl for lvl in mine if lvl["concurrency"] == concurrency), None)
        b = next((lvl for lvl in theirs if lvl["concurrency"] == concurrency), None)
        if a and b and b[key]:
            ratios.append(a[key] / b[key])
    return sorted(ratios)


def _signing_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 27: signed asks against the unsigned counterfactual, beside the raw floor.

    Judged on the median of the per-round ratios (each round runs both, one after the other), so a
    burst of load from elsewhere on the machine moves one round, not the verdict.
    """
    checks = []
    for concurrency, key, unit, limit in ((256, "rate", "asks/s", 0.7), (1, "p50_ms", "ms p50", 1.2)):
        signed, unsigned = _level(results, "broker", concurrency), _level(results, "broker-unsigned", concurrency)
        floor = _level(results, "floor", concurrency)
        ratios = _paired_ratios(results, "broker", "broker-unsigned", concurrency, key)
        if not (signed and unsigned and ratios):
            continue
        median = statistics.median(ratios)
        figure = "{:.0f}" if key == "rate" else "{:.3f}"
        measured = (
            f"signed {figure.format(signed[key])} vs unsigned {figure.format(unsigned[key])} {unit}"
            f" (best rounds); raw floor {figure.format(floor[key]) if floor else '-'}; signed/unsigned per round:"
            f" median {median:.2f}x over {len(ratios)} rounds, {ratios[0]:.2f}x to {ratios[-1]:.2f}x"
        )
        if key == "rate":
            checks.append(_check(f"signed asks: throughput at c=256 >= {limit}x unsigned", measured, median >= limit))
        else:
            checks.append(_check(f"signed asks: p50 latency at c=1 <= {limit}x unsigned", measured, median <= limit))
    return checks


def key_kinds(keys: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Namespace keys (``kind:rest`` after the namespace prefix) by kind: (count, total bytes)."""
    kinds: dict[str, tuple[int, int]] = {}
    for key, size in keys.items():
        kind = key.split(":", 1)[0]
        count, total = kinds.get(kind, (0, 0))
        kinds[kind] = (count + 1, total + size)
    return dict(sorted(kinds.items()))


def render_key_kinds(keys: dict[str, int]) -> str:
    """``kind`` N keys, B bytes (B per key), one per kind."""
    parts = []
    for kind, (count, total) in key_kinds(keys).items():
        each = f" ({total / count:.0f} B each)" if count > 1 else ""
        parts.append(f"`{kind}` {count} key{'s' if count > 1 else ''}, {total} B{each}")
    return "; ".join(parts) if parts else "none"


def cpu_total(level: dict[str, Any]) -> float | None:
    if "cpu_asker_ms" not in level:
        return None
    return float(level["cpu_asker_ms"] + level["cpu_answerer_ms"] + level["cpu_redis_ms"])


def machine() -> dict[str, Any]:
    """Where and what ran: recorded with the results, so a re-render from JSON keeps them."""
    return {
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {name: _version(name) for name in ("redis", "hiredis", "msgspec", "arq")},
        "commit": _commit(),
    }


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _commit() -> str:
    if os.environ.get("QBROKER_BENCH_COMMIT"):  # a run from an exported tree (git archive) names its commit
        return os.environ["QBROKER_BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2), dpi=110)
    for system, levels in results["throughput"].items():
        xs = [lvl["concurrency"] for lvl in levels]
        ys = [lvl["rate"] for lvl in levels]
        axis.plot(xs, ys, marker="o", label=LABELS[system])
    axis.set_xscale("log", base=2)
    axis.set_xlabel("asks in flight (concurrency)")
    axis.set_ylabel("round trips per second")
    axis.set_title("Ask -> automatic answer round trips, one asking process")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def verdict(check: dict[str, Any]) -> str:
    """met, missed, reported (a figure with no threshold) or not measured."""
    if check["met"] is None:
        return "reported" if check.get("reported") else "not measured"
    return "met" if check["met"] else "missed"


def render_before_after(before: dict[str, Any], checks: list[dict[str, Any]]) -> list[str]:
    """Each target measured by an earlier run (``--before``) and by this one."""
    earlier = {check["target"]: check for check in targets(before)}
    ran = before.get("machine") or {}
    lines = [
        "## Before and after",
        "",
        f"Before: the run of commit {ran.get('commit', 'unknown')} ({before.get('finished_utc', 'date unknown')}), "
        "the same benchmark and machine; after: this run. Ratios are the measure (the machine is shared, "
        "so absolute rates of both runs move together with its load).",
        "",
        "| target | before | after |",
        "| --- | --- | --- |",
    ]
    for check in checks:
        old = earlier.get(check["target"])
        was = f"{old['measured']} ({verdict(old)})" if old else "not measured"
        lines.append(f"| {check['target']} | {was} | {check['measured']} ({verdict(check)}) |")
    return [*lines, ""]


HAND_WRITTEN = "<!-- figures of other benchmarks, written by hand: kept when this file is written again -->"
"""a full run rewrites docs/benchmarks.md down to this line; what follows it is kept"""


def _section(title: str, *text: str) -> list[str]:
    """A section of the page: its heading, its lines, and the blank line that ends it."""
    return [f"## {title}", "", *text, ""]


def _runs(figures: dict[str, Any]) -> str:
    return ", ".join(f"{t:.2f}" for t in figures["runs"])


def write_doc(
    results: dict[str, Any], checks: list[dict[str, Any]], path: Path, before: dict[str, Any] | None = None
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    png = path.with_name("benchmarks-throughput.png")
    plot(results, png)
    path.with_name("benchmarks.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    args = results["args"]
    waiting, failover, cli = results.get("waiting"), results.get("failover"), results.get("cli")
    ran = results.get("machine") or machine()  # runs saved before issue 12 did not record it
    versions = ran["versions"]
    min_seconds = args.get("min_seconds")
    busy = f", each level kept busy at least {min_seconds:g} s" if min_seconds else ""
    lines = [
        "# Benchmarks",
        "",
        "Written by `python -m benchmarks` (also `qbroker bench`) on "
        f"{results.get('finished_utc') or time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        "do not edit by hand, run it again (the raw figures are in `benchmarks.json`).",
        "",
        "## Machine and versions",
        "",
        f"- CPU: {ran['cpu']}, {ran['cores']} cores (shared with other work: load average "
        f"{results['load_before'][0]:.2f} before, {results['load_after'][0]:.2f} after the run)",
        f"- OS: {ran['os']}",
        f"- Python {ran['python']}; redis-server {results['redis_version']} (private, loopback)",
        f"- redis-py {versions['redis']}, hiredis {versions['hiredis']}, msgspec {versions['msgspec']}, "
        f"arq {versions['arq']}; question-broker at commit {ran['commit']}",
        f"- Run: concurrency {','.join(map(str, args['concurrency']))}; per level max({args['asks']}, 4 x concurrency) "
        f"asks{busy}, no new ask after {args['max_seconds']:g} s, after 50 warm-up asks; {args['rounds']} round(s) "
        f"of every system in turn, each level's best round kept (the machine is shared); "
        f"total {results['seconds']:.0f} s",
        "",
        "## What runs",
        "",
        "Every system does the same round trip with the same one-question request: an asking process "
        "(its own OS process) fires asks at a fixed concurrency; an automatic answerer in another process "
        "answers each at once. Latency is from the call to the answer in hand, in the asking process.",
        "",
        "- **question-broker**: `await agent.ask(request, timeout=120)` as a live root agent registered with "
        "`broker.agent(...)`, so the caller gate (the agent's instance token checked in the ask script) and the "
        "timeout path (the ask raced against its deadline) run on every ask; the answerer is "
        "`async with broker.provider('bench') as p: async for pending in p: tasks.create_task(pending.answer(...))` "
        "(each answer its own task, as a UI answering several people would). "
        "Everything is on: the caller gate and enqueue in Lua, lease fencing, validation on both sides, "
        "the audit stream, the asker's liveness beat and sweep.",
        "- **broker, serial answers** (when measured): the same, but the loop awaits each "
        "`pending.answer(...)` before taking the next request, so answers never share a round trip.",
        "- **broker, keyed asks** (when measured): the same asks with `key=` (a key of its own each), so every "
        "ask reads its durable key and the ask script records it (issue 14).",
        "- **broker, unsigned (counterfactual)**: the same asks with signatures off, which the broker itself "
        "cannot do (docs/security.md): the benchmark's own two processes patch the provider's sealing out "
        "(the outcome JSON travels bare) and the asker's check of it (issue 27: what signing costs, measured "
        "in the same run; its targets are judged on the median of the per-round ratios).",
        "- **raw floor**: the least a stream-based design must do, with the same tools as the broker "
        "(redis-py with hiredis parsing and hiredis command packing, built by the broker's own client builder): "
        "the XADDs of concurrent asks pipelined over one connection (what an auto-pipelining client does); "
        "XREADGROUP by one consumer; the answers RPUSHed to the asking process's inbox list with one XACK + XDEL "
        "per read batch, in one pipeline; one BLMPOP with COUNT per asking process, demultiplexed by request id. "
        "No validation, leases, agents or audit.",
        f"- **arq**: `enqueue_job` then `job.result(poll_delay={args['arq_poll_delay']:g})`; the worker "
        f"(`poll_delay={args['arq_poll_delay']:g}`, `max_jobs={args['arq_max_jobs']}`) returns the answer.",
        "",
        "## Throughput and latency",
        "",
        render_table(results),
        "",
        f"![throughput against concurrency]({png.name})",
        "",
        "CPU time per ask, by process (from /proc and Redis `INFO cpu`, over each level alone: process "
        "start-up, imports and the warm-up are not counted; the machine has "
        f"{ran['cores']} cores for all three processes, so at high concurrency they compete):",
        "",
        render_cpu(results),
        "",
        "Redis time by command (`INFO commandstats` over each system's run, divided by its asks; "
        "EVALSHA includes the commands the Lua scripts run):",
        "",
        render_commandstats(results),
        "",
    ]
    if waiting:
        per_key = waiting["per_key"]
        lines += _section(
            "Connections, memory, residue",
            f"One asking process starts {waiting['asks']} asks; the provider holds the lease and answers none, "
            "so every ask is accepted, delivered and pending.",
            "",
            f"- Redis connections held by the asking process: **{waiting['asker_connections']}** "
            f"(`CLIENT LIST` count with the asks waiting minus the count before the process started).",
            f"- `used_memory` per pending ask: **{waiting['per_ask_bytes']:.0f} B** "
            f"({waiting['used_memory_before']} B before, {waiting['used_memory_pending']} B with all pending). "
            f"By `MEMORY USAGE`: request hash {per_key['request_hash']} B; requests stream "
            f"{per_key['requests_stream_per_ask']:.0f} B per ask; audit stream {per_key['audit_per_entry']:.0f} B per "
            f"entry ({per_key['audit_entries']} entries, capped at the audit max length).",
            f"- Residue after all were answered (a provider then took over and answered them all; "
            f"all answered correctly: {waiting['all_answered']}): **{waiting['residue_open_keys']} per-request "
            f"keys, {waiting['residue_open_bytes']} B** one second after the last answer with the asking process "
            f"still open; **{waiting['residue_keys']} keys, {waiting['residue_bytes']} B** after it closed its "
            f"broker. `used_memory` after: {waiting['used_memory_after']} B."
            + (
                f" Not counted: {waiting['tombstones']} tombstones ({waiting['tombstone_bytes']} B), the "
                "settled requests' hashes written anew with what a retry reads (state, settle call id, `by`, "
                "client), which expire 60 s after the answer (so that a provider's settle retried after a lost "
                "reply still succeeds)."
                if "tombstones" in waiting
                else ""
            ),
            "- Namespace keys left one second after the asking process closed, by kind (bytes by `MEMORY USAGE`): "
            + render_key_kinds(waiting["namespace_keys_after"])
            + ". Fixed per namespace or per process: the capped audit stream, the (empty) requests stream "
            "with its group, the lease epoch counter, the lease-release signal list and one liveness key per "
            "broker process (each expires with the client TTL); `req` keys here are the tombstones, which "
            "expire 60 s after their answer (every key is listed in `benchmarks.json`).",
        )
    if failover:
        lines += _section(
            "Failover",
            f"`kill -9` of the lease-holding provider process, then an ask; time to its answer from the standby "
            f"process: **median {failover['median']:.2f} s** with lease TTL **{failover['lease_ttl']:g} s** "
            f"(runs: {_runs(failover)} s). The lease is renewed every TTL/3, so it lapses between 2/3 TTL and one "
            "TTL after the kill; a clean exit releases it at once.",
        )
    if cli:
        lines += _section(
            "The command line",
            "`qbroker ask --question ... --option yes --option no`, a new process each time (interpreter start-up and "
            "imports included), against a `qbroker auto` provider already running: "
            f"**median {cli['median']:.2f} s** wall, end to end (runs: {_runs(cli)} s).",
        )
    scale = results.get("scale_out")
    if scale:
        single, spread = scale["single"], scale["cluster"]
        per = ", ".join(f"{level['rate']:.0f}" for level in spread["levels"])
        lines += _section(
            "Scale-out on a Redis Cluster",
            "Three namespaces on a three-master Redis Cluster (on this machine, loopback; each namespace's slot on "
            "another master), each with its own asking process and providing process running at once, against one "
            f"namespace on the run's single Redis; every asker at concurrency {scale['concurrency']}, "
            "the same asks as above. Aggregate asks/s: all asks over the time from the first asker's start to the "
            "last one's end (a lower bound; the askers' own windows do not quite coincide).",
            "",
            f"- One namespace, one Redis: **{scale['single_rate']:.0f} asks/s** ({single['asks']} asks in "
            f"{single['seconds']:.1f} s).",
            f"- Three namespaces, three masters: **{scale['cluster_rate']:.0f} asks/s** aggregate "
            f"({spread['asks']} asks in {spread['seconds']:.1f} s; per asker {per} asks/s).",
            f"- Ratio: **{scale['ratio']:.2f}x**.",
            "",
            f"This machine has {ran['cores']} cores for everything: three Redis servers and six Python processes "
            "share them (against one server and two processes), so the ratio shows what the cluster costs here "
            "(client-side slot routing, more processes on the same cores), not the gain three machines would give. "
            "Namespaces share no keys, slots or scripts, so with a master and its processes per machine each "
            "namespace would be expected to run as the single one does here (not measured: one machine).",
        )
    lines += ["## Targets (issue 12)", ""]
    for check in checks:
        said = verdict(check).replace("missed", "**missed**")
        lines.append(f"- {check['target']}: {check['measured']}: {said}")
    lines.append("")
    if before is not None:
        lines += render_before_after(before, checks)
    lines += [
        "Why the throughput and latency ratios are what they are, and what the profile shows: "
        "[benchmarks-profile.md](benchmarks-profile.md) (written by hand).",
        "",
    ]
    kept = path.read_text().partition(HAND_WRITTEN)[1:] if path.exists() else ("", "")
    path.write_text("\n".join(lines) + "".join(kept))
    return path
