"""``qbroker status [--json] [--limit N] [--after ENTRY]``: the lease holder, pending requests, live agents."""

from __future__ import annotations

import argparse

from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show a namespace's provider, pending requests and live agents",
        description="Show the namespace's lease holder, epoch, standbys and maintenance worker (with the seconds "
        "left before each counts as gone), how many requests are "
        "pending and agents live, the request stream's length and the dead-letter count; then the "
        "oldest pending requests with their age and asking agent, and live agents with their owner.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument(
        "--limit",
        type=_count,
        default=50,
        metavar="N",
        help="list the oldest N pending requests and the first N agents (counts cover all); 0 lists all; default 50",
    )
    parser.add_argument(
        "--after",
        type=_entry,
        default=None,
        metavar="ENTRY",
        help="list the pending requests after this one's stream entry (a listed ENTRY, or the `next page` "
        "a listing ends with: page through them all)",
    )
    parser.set_defaults(func=run)


def _entry(text: str) -> str:
    milliseconds, _, sequence = text.partition("-")
    if not (milliseconds.isdigit() and sequence.isdigit()):
        raise argparse.ArgumentTypeError("must be a stream entry id, as <milliseconds>-<sequence>")
    return text


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


async def run(args: argparse.Namespace) -> int:
    from workers.operating.status.view import show

    return await show(args)
