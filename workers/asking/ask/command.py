"""``qbroker ask``: ask a human from a shell script; the answer is JSON on stdout.

On failure, ``{name, code, message}`` goes to stderr and the exit status names the code
(``EXIT_STATUS``). Ctrl-C (or SIGTERM) withdraws the question before exiting; with ``--key``
it detaches instead (exit status ``EXIT_DETACHED``): the question stays pending for the
detach grace, and running the same command again picks the answer up. The work is
in ``workers.asking.ask.engine``, imported only when the command runs (``--help`` stays instant).
"""

from __future__ import annotations

import argparse

from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "ask",
        help="ask a question from a shell; prints the answer as JSON",
        description="Ask one question built from flags, or a whole request read as JSON from a file "
        "or stdin ('-'). Prints the answer JSON on stdout. On failure prints {name, code, message} "
        "on stderr and exits with the status of that code (see docs/cli.md). Ctrl-C withdraws.",
    )
    _add_question_arguments(parser)
    _add_asking_arguments(parser)
    parser.set_defaults(func=run)


def _add_question_arguments(parser: argparse.ArgumentParser) -> None:
    """What to ask: one question built from flags, or a whole request read as JSON."""
    source = parser.add_argument_group("the question (flags), or --request")
    either = source.add_mutually_exclusive_group()  # both at once: a usage error (exit 2)
    either.add_argument("--request", "-r", metavar="FILE", help="JSON request file, '-' for stdin")
    either.add_argument("--question", "-q", metavar="TEXT", help="the question text")
    source.add_argument("--id", default="q1", help="the question's id, echoed in the answer (default q1)")
    source.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="LABEL[=DESCRIPTION]",
        help="an option (repeat for more); none means free text only",
    )
    source.add_argument("--multi", action="store_true", help="allow selecting several options")
    source.add_argument("--header", metavar="TEXT", help="a short group label shown with the question")
    source.add_argument("--detail-file", metavar="FILE", help="markdown shown with the question ('-': stdin)")
    source.add_argument(
        "--plan-review",
        metavar="APPROVE_LABEL",
        help="present as a plan review; the detail is the plan, APPROVE_LABEL the approving option",
    )


def _add_asking_arguments(parser: argparse.ArgumentParser) -> None:
    """How to ask it: through which route, as which agent, for how long, under which key."""
    parser.add_argument(
        "--gateway",
        dest="gateway_url",
        metavar="URL",
        help="ask through `qbroker gateway` (http(s)://... or unix:/path; env QBROKER_GATEWAY_URL) with the token in "
        "QBROKER_GATEWAY_TOKEN (or _FILE): no Redis credentials, and the token decides the agent",
    )
    parser.add_argument(
        "--agent",
        metavar="ID",
        help="ask as one process of this agent id (joined for the ask's duration; other processes of the id "
        "asking at the same time are not disturbed)",
    )
    parser.add_argument("--owner", metavar="ID", help="with --agent: the (live) agent that owns it")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="with --agent: this is a new instance of the agent (it restarted): the questions its earlier "
        "processes still ask are withdrawn and they can ask no more",
    )
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="give up after this long (ASK_TIMED_OUT)")
    parser.add_argument(
        "--key",
        metavar="KEY",
        help="name the question durably: if this command is killed, the question stays pending and "
        "running it again with the same key and question picks the answer up; Ctrl-C then detaches "
        "instead of withdrawing",
    )
    parser.add_argument(
        "--detach-grace",
        type=float,
        metavar="SECONDS",
        help="with --key: how long the question waits for this command to come back (default 300)",
    )
    parser.add_argument(
        "--priority",
        metavar="LEVEL",
        help="urgent, normal or low: providers present urgent questions first (default: the request's own, "
        "else normal; another value is BAD_REQUEST)",
    )
    parser.add_argument(
        "--no-coalesce",
        action="store_true",
        help="present it on its own, even when other agents ask the identical question (by default one "
        "answer settles them all)",
    )
    parser.add_argument(
        "--no-remember",
        action="store_true",
        help="always ask a human: no remembered decision answers it, and its answer is not remembered",
    )


async def run(args: argparse.Namespace) -> int:
    from workers.asking.ask.engine import ask

    return await ask(args)
