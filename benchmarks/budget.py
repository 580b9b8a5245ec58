"""The per-ask budget of a benchmark run: ``python -m benchmarks.budget RUN.json [--label TEXT]``.

``python -m benchmarks.budget --monitor FILE --asks N`` reads instead a ``redis-cli monitor`` capture of N asks
(docs/benchmarks-budget.md says how it is taken) and prints, per script call and per other command, the calls per
ask, the commands each script call ran inside it, and the bytes sent (a MONITOR line's length is about its RESP size).

Reads the JSON of ``python -m benchmarks ... --json RUN.json`` and prints, per ask, Markdown for
docs/benchmarks-budget.md: the Redis commands (``INFO commandstats``: calls inside scripts count too), Redis's bytes
in and out and its socket reads (``INFO stats``; about one per round trip), and the CPU of each process with the
rate and p50 against the raw floor, as the median of the rounds. Counts do not depend on the machine's load;
CPU and rates do (the run's load is printed with them).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

_SKIPPED = ("xgroup", "xinfo", "info", "config", "client")
"""set-up and the benchmark's own probes, not asks"""


def commands(results: dict[str, Any], system: str) -> dict[str, float]:
    asks = results["commandstats_asks"][system]
    stats = results["commandstats"][system]
    return {
        name: stat["calls"] / asks
        for name, stat in sorted(stats.items(), key=lambda item: -item[1]["calls"])
        if not name.startswith(_SKIPPED) and stat["calls"] / asks >= 0.005
    }


def wire(results: dict[str, Any], system: str) -> dict[str, float]:
    asks = results["commandstats_asks"][system]
    counted = results.get("wire", {}).get(system, {})
    return {field: value / asks for field, value in counted.items()}


def medians(results: dict[str, Any], system: str) -> dict[int, dict[str, float]]:
    by_level: dict[int, list[dict[str, Any]]] = {}
    for run in results["rounds"][system]:
        for level in run:
            by_level.setdefault(level["concurrency"], []).append(level)
    fields = ("rate", "p50_ms", "cpu_asker_ms", "cpu_answerer_ms", "cpu_redis_ms")
    return {c: {f: statistics.median(level[f] for level in levels) for f in fields} for c, levels in by_level.items()}


def render(results: dict[str, Any], label: str) -> str:
    lines = [f"### {label}", "", f"Load average before the run: {results.get('load_before')}", ""]
    mine, floor = medians(results, "broker"), medians(results, "floor")
    lines += [
        "| c | broker asks/s | floor asks/s | ratio | broker p50 ms | floor p50 ms | p50 ratio "
        "| asker CPU ms/ask | provider CPU ms/ask | Redis CPU ms/ask | floor CPU ms/ask (asker+server+Redis) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c, m in sorted(mine.items()):
        f = floor.get(c)
        if f is None:
            continue
        floor_cpu = f"{f['cpu_asker_ms']:.3f}+{f['cpu_answerer_ms']:.3f}+{f['cpu_redis_ms']:.3f}"
        lines.append(
            f"| {c} | {m['rate']:.0f} | {f['rate']:.0f} | {m['rate'] / f['rate']:.2f}x | {m['p50_ms']:.2f} "
            f"| {f['p50_ms']:.2f} | {m['p50_ms'] / f['p50_ms']:.1f}x | {m['cpu_asker_ms']:.3f} "
            f"| {m['cpu_answerer_ms']:.3f} | {m['cpu_redis_ms']:.3f} | {floor_cpu} |"
        )
    lines += ["", "| per ask (all levels) | broker | floor |", "| --- | ---: | ---: |"]
    ours, theirs = wire(results, "broker"), wire(results, "floor")
    for field in ours:
        lines.append(f"| {field} | {ours[field]:.1f} | {theirs.get(field, 0.0):.1f} |")
    ran, base = commands(results, "broker"), commands(results, "floor")
    lines.append(f"| Redis commands (scripts' own included) | {sum(ran.values()):.2f} | {sum(base.values()):.2f} |")
    lines.append("| " + ", ".join(f"{name} {calls:.2f}" for name, calls in ran.items()) + " | | |")
    return "\n".join(lines) + "\n"


_MONITORED = re.compile(r'^[\d.]+ \[\d+ (?P<source>[^\]]+)\] "(?P<command>[^"]+)"(?: "(?P<first>[^"]*)")?')


def monitored(text: str, asks: int) -> str:
    """Per script (by SHA prefix) or command sent: calls per ask, commands run inside per call, bytes per call."""
    calls: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    inside: Counter[str] = Counter()
    what: dict[str, Counter[str]] = {}
    current = None
    for line in text.splitlines():
        match = _MONITORED.match(line)
        if match is None:
            continue
        command = match["command"].upper()
        if match["source"] == "lua":
            if current is not None:
                inside[current] += 1
                what.setdefault(current, Counter())[command] += 1
            continue
        current = f"EVALSHA {(match['first'] or '')[:8]}" if command == "EVALSHA" else None
        name = current or command
        calls[name] += 1
        sent[name] += len(line)
    lines = [
        "| sent | calls per ask | commands inside per call | bytes per call | inside |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for name, count in calls.most_common():
        if count / asks < 0.05:
            continue
        inner = ", ".join(f"{c} {n / count:.2f}" for c, n in what.get(name, Counter()).most_common())
        lines.append(
            f"| {name} | {count / asks:.2f} | {inside[name] / count:.2f} | {sent[name] / count:.0f} | {inner} |"
        )
    total = sum(calls.values()) + sum(inside.values())
    lines.append(f"| all | | {total / asks:.2f} commands per ask | {sum(sent.values()) / asks:.0f} per ask | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--label", default="a run")
    parser.add_argument("--monitor", action="store_true", help="RUN is a redis-cli monitor capture")
    parser.add_argument("--asks", type=int, default=0, help="with --monitor: the asks it holds")
    args = parser.parse_args(argv)
    if args.monitor:
        print(monitored(args.run.read_text(errors="replace"), args.asks))
    else:
        print(render(json.loads(args.run.read_text()), args.label))


if __name__ == "__main__":
    main()
