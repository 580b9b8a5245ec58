"""``qbroker decisions list [--json]`` and ``qbroker decisions revoke ID``: remembered decisions."""

from __future__ import annotations

import argparse

from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "decisions",
        help="list or revoke the namespace's remembered decisions",
        description="`list`: the live remembered decisions (answers a provider stored with "
        "remember, which answer later identical asks at once): id, scope, agent, answer, question, "
        "who set it, when, and when it expires. `revoke ID`: forget one (audited); the next "
        "identical ask reaches a human again.",
    )
    parser.add_argument("action", choices=("list", "revoke"), help="list the decisions, or revoke one")
    parser.add_argument("id", nargs="?", metavar="ID", help="with revoke: the decision's id (from list)")
    parser.add_argument("--json", action="store_true", help="with list: print a JSON array instead of a table")
    parser.add_argument("--by", metavar="NAME", help="with revoke: who revokes, for the audit (default: $USER@host)")
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from workers.operating.decisions.view import run as run_view

    return await run_view(args)
