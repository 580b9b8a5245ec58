"""``qbroker bench``: run the benchmark of ``benchmarks/`` (same options as ``python -m benchmarks``)."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from workers.settings import Subparsers


async def run(args: argparse.Namespace) -> int:
    # Imported late: the benchmark needs the `bench` extra (arq, matplotlib) and a source checkout.
    benchmark: Any = importlib.import_module("benchmarks.run")
    return int(await benchmark.run(args))


def register(subparsers: Subparsers) -> None:
    try:
        options: Any = importlib.import_module("benchmarks.options")
    except ImportError:  # an installed wheel carries no benchmarks/: the command is left out
        return
    parser = subparsers.add_parser(
        "bench",
        help="benchmark the broker against the raw Redis floor and arq; writes docs/benchmarks.md",
        description="Starts a private redis-server and measures throughput, latency, connections, memory, failover.",
    )
    options.add_arguments(parser)
    parser.set_defaults(func=run)
