"""What coalescing and the priority schedule add to a provider's work per ask, in microseconds.

python -m benchmarks.feature_cost [--asks N]

The throughput systems (``--systems broker,broker-no-coalesce,broker-priorities``) compare whole
runs, which a shared machine's noise can swamp; this measures only the provider-side code the
features add, best of several repeats, against what it replaced: the request fingerprint of
every delivered ask (skipped with ``coalesce=False``), and the schedule's push and pop against
the ``asyncio.Queue`` put and get it replaced. Compare the figures with the CPU per ask of a
benchmark run (docs/benchmarks.md): the features' share of it is their cost.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker.answering._schedule import Schedule, request_fingerprint

from .roles import REQUEST


@dataclass
class _Card:
    level: int
    agent_id: str
    created_ms: int


def _best_us(run: Callable[[int], None], n: int, repeats: int = 7) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run(n)
        best = min(best, time.perf_counter() - started)
    return best / n * 1e6


def measure(asks: int) -> dict[str, float]:
    cards = [_Card(level=i % 3, agent_id=f"agent-{i % 3}", created_ms=i) for i in range(asks)]

    def fingerprints(n: int) -> None:
        for _ in range(n):
            request_fingerprint(REQUEST)

    def scheduled(n: int) -> None:
        schedule: Schedule[_Card] = Schedule()
        for card in cards[:n]:
            schedule.push(card, card.level, card.agent_id)
        while schedule.pop(lambda _card, _level: True) is not None:
            pass

    def queued(n: int) -> None:
        queue: asyncio.Queue[_Card] = asyncio.Queue()
        for card in cards[:n]:
            queue.put_nowait(card)
        while not queue.empty():
            queue.get_nowait()

    return {
        "fingerprint_us": _best_us(fingerprints, asks),
        "schedule_us": _best_us(scheduled, asks),
        "queue_us": _best_us(queued, asks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=20_000, help="asks per repeat (default 20000)")
    args = parser.parse_args()
    figures = measure(args.asks)
    added = figures["fingerprint_us"] + figures["schedule_us"] - figures["queue_us"]
    print(f"request fingerprint (coalescing): {figures['fingerprint_us']:.2f} us per ask")
    print(f"schedule push + pop (priorities): {figures['schedule_us']:.2f} us per ask")
    print(f"asyncio.Queue put + get (before): {figures['queue_us']:.2f} us per ask")
    print(f"added provider CPU per ask: {added:.2f} us")


if __name__ == "__main__":
    main()
