"""``qbroker bench``: run this benchmark from the CLI (same options as ``python -m benchmarks``).

It lives here, not in workers/: the workers never import the benchmark. ``workers.cli.COMMANDS`` names
this module, and an installation without benchmarks/ (a wheel) leaves the command out, as it does any
command whose module is missing.
"""

from __future__ import annotations

import argparse

from benchmarks import options
from workers.settings import Subparsers

__all__ = ["register", "run"]


async def run(args: argparse.Namespace) -> int:
    # Imported late: the benchmark needs the `bench` extra (arq, matplotlib).
    from benchmarks.run import run as run_benchmark

    return int(await run_benchmark(args))


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark the broker against the raw Redis floor and arq; writes docs/benchmarks.md",
        description="Starts a private redis-server and measures throughput, latency, connections, memory, failover.",
    )
    options.add_arguments(parser)
    parser.set_defaults(func=run)
