"""``qbroker ask``: ask a human from a shell script; the answer is JSON on stdout.

On failure, ``{name, code, message}`` goes to stderr and the exit status names the code
(``EXIT_STATUS``). Ctrl-C (or SIGTERM) withdraws the question before exiting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Final

import msgspec
from redis.exceptions import RedisError

from broker import (
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PlanReviewIntent,
    UserQuestionError,
)
from broker.errors import BAD_REQUEST, BROKER_UNAVAILABLE
from broker.types import decode_request, encode

from ..settings import Settings

__all__ = ["EXIT_STATUS", "register"]

EXIT_OK: Final = 0
EXIT_INTERNAL: Final = 1
EXIT_USAGE: Final = 2
# One status per error code; documented in docs/cli.md. Codes an asker cannot meet
# (they belong to providers) still get one, so the table is total.
EXIT_STATUS: Final[Mapping[str, int]] = {
    "BROKER_UNAVAILABLE": 3,
    "BAD_REQUEST": 4,
    "EMPTY_QUESTIONS": 5,
    "BAD_INTENT": 6,
    "NO_PROVIDER": 7,
    "ASK_CANCELLED": 8,
    "ASK_TIMED_OUT": 9,
    "ASK_ABORTED": 10,
    "CALLER_NOT_LIVE": 11,
    "DELEGATED_CALLER": 12,
    "BAD_ANSWER": 13,
    "NOT_PENDING": 14,
    "LEASE_LOST": 15,
    "DUPLICATE_PROVIDER": 16,
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "ask",
        help="ask a question from a shell; prints the answer as JSON",
        description="Ask one question built from flags, or a whole request read as JSON from a file "
        "or stdin ('-'). Prints the answer JSON on stdout. On failure prints {name, code, message} "
        "on stderr and exits with the status of that code (see docs/cli.md). Ctrl-C withdraws.",
    )
    source = parser.add_argument_group("the question (flags), or --request")
    source.add_argument("--request", "-r", metavar="FILE", help="JSON request file, '-' for stdin")
    source.add_argument("--question", "-q", metavar="TEXT", help="the question text")
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
    parser.add_argument("--agent", metavar="ID", help="ask as this agent id (registered for the ask's duration)")
    parser.add_argument("--owner", metavar="ID", help="with --agent: the (live) agent that owns it")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="give up after this long (ASK_TIMED_OUT)")
    parser.set_defaults(func=run)


def _fail(error: UserQuestionError) -> int:
    sys.stderr.buffer.write(encode(error.to_payload()) + b"\n")
    sys.stderr.flush()
    return EXIT_STATUS.get(error.code, EXIT_INTERNAL)


def _read(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as error:
        raise UserQuestionError(f"cannot read {path}: {error.strerror}", BAD_REQUEST) from error


def build_request(args: argparse.Namespace) -> AskUserQuestionRequest:
    """The request from ``--request`` or from the question flags."""
    if args.request is not None:
        if args.question is not None:
            raise UserQuestionError("give either --request or --question, not both", BAD_REQUEST)
        try:
            request = decode_request(_read(args.request))
        except msgspec.DecodeError as error:
            raise UserQuestionError(f"the request is not valid: {error}", BAD_REQUEST) from error
    elif args.question is not None:
        options = []
        for text in args.option:
            label, _, description = text.partition("=")
            options.append(AskUserQuestionOption(label=label, description=description or None))
        item = AskUserQuestionItem(
            id=args.id,
            question=args.question,
            header=args.header,
            detail=_read(args.detail_file).decode() if args.detail_file else None,
            options=tuple(options) or None,
            multi_select=args.multi,
            intent=PlanReviewIntent(approve=args.plan_review) if args.plan_review else None,
        )
        request = AskUserQuestionRequest(questions=(item,))
    else:
        raise UserQuestionError("nothing to ask: give --question or --request", BAD_REQUEST)
    if args.agent is not None:
        request = msgspec.structs.replace(request, agent=args.agent)
    return request


@contextlib.contextmanager
def _abort_on_signals(abort: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, abort.set)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@contextlib.asynccontextmanager
async def _as_agent(broker: Broker, agent_id: str | None, owner: str | None) -> AsyncIterator[None]:
    if agent_id is None:
        yield
        return
    async with broker.agent(agent_id, owner=owner):
        yield


async def run(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    if args.owner is not None and args.agent is None:
        return _fail(UserQuestionError("--owner needs --agent", BAD_REQUEST))
    abort = asyncio.Event()
    with _abort_on_signals(abort):
        try:
            request = build_request(args)
            async with settings.broker() as broker, _as_agent(broker, args.agent, args.owner):
                # Caught inside the block: `broker.agent()` wraps what its body raises in an
                # ExceptionGroup (its TaskGroup).
                try:
                    answer = await broker.ask(request, abort=abort, timeout=args.timeout)
                except UserQuestionError as error:
                    return _fail(error)
        except UserQuestionError as error:
            return _fail(error)
        except (OSError, RedisError) as error:  # unreachable, refused AUTH, ...
            return _fail(UserQuestionError(f"Redis is unavailable: {error}", BROKER_UNAVAILABLE))
    sys.stdout.buffer.write(encode(answer) + b"\n")
    sys.stdout.flush()
    return EXIT_OK
