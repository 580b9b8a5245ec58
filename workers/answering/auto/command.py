"""``qbroker auto --rules FILE``: an automatic provider for pipelines, tests and benchmarks.

It holds the namespace's lease (or stands by until the holder goes) and answers each
request by the first matching rule (see ``workers.answering.auto.rules``). A request a quorum
policy covers (``--policy-file``, docs/approvals.md) is left to humans: no rule answers it. When it loses the lease
(it paused past its TTL, say) its late answers are refused by Redis; it says so and
stands by again, or exits with ``--exit-on-lease-loss``.
"""

from __future__ import annotations

import argparse

from workers.answering.options import add_policy_arguments, add_provider_arguments
from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "auto",
        help="answer requests automatically by TOML rules",
        description="Hold the namespace's provider lease (standing by while another holds it) and "
        "answer every request by the first matching rule of FILE. Invalid rules fail at start, "
        "naming the line at fault (exit 2).",
    )
    parser.add_argument("--rules", required=True, metavar="FILE", help="the TOML rules file (see docs/cli.md)")
    add_policy_arguments(
        parser,
        policy_help="quorum policies: a question one covers is left pending for people, never answered by a rule",
        users_help="the web's users file, for the policies' [groups]",
    )
    add_provider_arguments(parser, default_name="auto@HOST:PID")
    parser.add_argument(
        "--exit-on-lease-loss",
        action="store_true",
        help="exit with status 15 (LEASE_LOST) when the lease is lost, instead of standing by again",
    )
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from workers.answering.auto.provider import serve  # the broker and the rules engine load only to run

    return await serve(args)
