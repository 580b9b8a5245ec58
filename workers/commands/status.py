"""``qbroker status [--json]``: the lease holder, standbys, pending requests, live agents."""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="show a namespace's provider, pending requests and live agents",
        description="Show the namespace's lease holder, epoch and standbys; pending requests with "
        "their age and asking agent; live agents with their owner; the request stream's length "
        "and the dead-letter count.",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from ..status_view import show

    return await show(args)
