"""The benchmark's command-line options, shared by ``python -m benchmarks`` and ``qbroker bench``.

Standard library only, so that the CLI can add them without importing the benchmark itself.
"""

from __future__ import annotations

import argparse

FULL_LEVELS = (1, 16, 256, 1024)
QUICK_LEVELS = (1, 16, 64)
SYSTEMS = (
    "broker",
    "floor",
    "arq",
    "broker-serial",
    "broker-keyed",
    "broker-no-remember",
    "broker-decided",
    "broker-no-coalesce",
    "broker-priorities",
    "broker-unsigned",
)
DEFAULT_SYSTEMS = ("broker", "broker-unsigned", "floor", "arq")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = set(names) - set(SYSTEMS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (a minute or less); writes no doc unless --doc is given"
    )
    parser.add_argument(
        "--concurrency", type=_ints, default=None, help="comma-separated levels (default 1,16,256,1024; quick 1,16,64)"
    )
    parser.add_argument(
        "--asks", type=int, default=None, help="asks per level, >= 4 x concurrency (default 4000; quick 200)"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="stop starting asks at a level after this (default 8; quick 2)"
    )
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=None,
        help="keep every level busy at least this long, asks permitting (default 2; quick 0.5)",
    )
    parser.add_argument(
        "--systems",
        type=_names,
        default=list(DEFAULT_SYSTEMS),
        help="which of broker,broker-unsigned,floor,arq,broker-serial,broker-keyed,broker-no-remember,broker-decided,"
        "broker-no-coalesce,broker-priorities (default broker,broker-unsigned,floor,arq; broker-unsigned: the same "
        "asks with signing and its check patched out of the benchmark's processes, to measure what signing costs; "
        "broker-serial awaits each answer; "
        "broker-keyed asks every question with a key of its own; broker asks look remembered decisions up and miss, "
        "broker-no-remember asks with remember=False, broker-decided asks are all answered by a remembered decision; "
        "broker-no-coalesce asks with coalesce=False (no request fingerprint at the provider); broker-priorities "
        "asks as three agents in turn, cycling urgent, normal and low)",
    )
    parser.add_argument(
        "--waiting",
        type=int,
        default=None,
        help="asks left waiting for the connection/memory count (default 10000)",
    )
    parser.add_argument("--failover-runs", type=int, default=None, help="kill -9 runs (default 5; quick 1)")
    parser.add_argument(
        "--lease-ttl",
        type=float,
        default=None,
        help="providers' lease TTL (s) in the failover runs (default 10; quick 1)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="throughput rounds; each level's best is kept (default 2; quick 1)"
    )
    parser.add_argument("--arq-poll-delay", type=float, default=0.005, help="arq poll delays (s)")
    parser.add_argument("--arq-max-jobs", type=int, default=4096, help="arq worker max_jobs")
    parser.add_argument(
        "--skip-extras", action="store_true", help="skip connections, memory, failover and the `qbroker ask` timing"
    )
    parser.add_argument(
        "--doc",
        default=None,
        help="write the report and its PNG here (full runs: docs/benchmarks.md)",
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="also dump the raw results as JSON")
    parser.add_argument(
        "--from-json", default=None, metavar="PATH", help="measure nothing: report the results a --json run saved"
    )
    parser.add_argument(
        "--before",
        default=None,
        metavar="PATH",
        help="a --json run of an earlier commit: the report compares each target before and after",
    )
    parser.add_argument("--no-doc", action="store_true", help="write no doc")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="py-spy profiles of the broker's asker and provider",
    )


_SIZED_DEFAULTS: dict[str, tuple[float, float]] = {
    "asks": (200, 4000),
    "max_seconds": (2.0, 8.0),
    "min_seconds": (0.5, 2.0),
    "waiting": (200, 10_000),
    "failover_runs": (1, 5),
    "lease_ttl": (1.0, 10.0),
    "rounds": (1, 2),
}
"""each option left unset: its value with ``--quick``, and without"""


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on ``--quick``."""
    quick = bool(args.quick)
    if args.concurrency is None:
        args.concurrency = list(QUICK_LEVELS if quick else FULL_LEVELS)
    for name, (quick_value, full_value) in _SIZED_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick_value if quick else full_value)
    args.min_seconds = min(args.min_seconds, args.max_seconds)
    if args.no_doc:
        args.doc = None
    elif args.doc is None and not quick:
        args.doc = "docs/benchmarks.md"
    return args
