"""``qbroker audit verify``: check that a namespace's audit was not tampered with (docs/security.md).

Walks the audit stream, recomputes its chain and checks its checkpoints' signatures against the
trusted keys; reports an entry deleted, altered or inserted (by id), where the stream starts
(earlier entries trimmed by its cap) and how many entries follow the last checkpoint (not yet
sealed). Exit status: 0 intact, ``EXIT_TAMPERED`` when something was found, ``EXIT_UNCHAINED``
when nothing in it is chained (written by an older version, or by fakeredis), else the coded
error's (``EXIT_STATUS``: 3 Redis unavailable, 17 no trusted key).
"""

from __future__ import annotations

import argparse

from workers.exits import EXIT_AUDIT_TAMPERED as EXIT_TAMPERED
from workers.exits import EXIT_AUDIT_UNCHAINED as EXIT_UNCHAINED
from workers.settings import Subparsers

__all__ = ["EXIT_TAMPERED", "EXIT_UNCHAINED", "register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="verify the namespace's audit: every entry chained, checkpoints signed by a trusted key",
        description="`verify`: walk the audit stream, recompute its chain and check its checkpoints against "
        "the trusted keys (--trusted-keys-file); report a deleted, altered or inserted entry by id. "
        f"Exit 0 intact, {EXIT_TAMPERED} tampered with, {EXIT_UNCHAINED} not chained at all.",
    )
    parser.add_argument("action", choices=("verify",), help="verify the audit stream")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from workers.operating.audit.view import run as run_view

    return await run_view(args)
