"""``qbroker provide``: the terminal provider, a human answering at this terminal.

It holds the namespace's lease (or stands by, saying so, and takes over when the holder
goes) and presents each request in arrival order. A request the asker withdraws leaves
the screen with a notice; losing the lease stops presenting at once and says so.
"""

from __future__ import annotations

import argparse

from workers.answering.options import add_policy_arguments, add_provider_arguments
from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "provide",
        help="answer questions at this terminal",
        description="Hold the namespace's provider lease (standing by while another provider holds "
        "it) and present each request here: options by number, o for Other, s to skip one question "
        "of several, c to cancel the request, v to view a long detail or arguments whole; when a page asks "
        "to take over, h hands the shown request to it unanswered. Ctrl-C (or Ctrl-D) quits and hands the "
        "lease on.",
    )
    add_provider_arguments(parser, default_name="USER@HOST:PID")
    parser.add_argument(
        "--remember-ttl",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="after an answer, offer to remember it (for the agent or the namespace) for this long "
        "(default 3600; 0: do not offer)",
    )
    add_policy_arguments(
        parser,
        policy_help="quorum policies: a covered question takes one vote from here, the person named by --as",
        users_help="the web's users file, for its [groups]",
    )
    parser.add_argument(
        "--as", dest="person", metavar="PERSON", help="who answers here, as the groups name people (default: USER)"
    )
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from workers.answering.provide.provider import serve  # the broker, prompt_toolkit and rich load only to run

    return await serve(args)
