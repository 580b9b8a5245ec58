"""The engine of ``qbroker decisions``: list and revoke a namespace's remembered decisions."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
import time

import msgspec
from redis.exceptions import RedisError

from broker import Decision, Reads, UserQuestionError
from broker.errors import BAD_REQUEST, BROKER_UNAVAILABLE
from workers.exits import EXIT_STATUS
from workers.operating.text_table import duration, table
from workers.settings import Settings

__all__ = ["format_decisions", "run"]

EXIT_NOT_FOUND = 1


def format_decisions(decisions: list[Decision], now_ms: int) -> str:
    """The human form: one table row per decision, oldest first."""
    if not decisions:
        return "no remembered decisions"
    rows = [
        (
            d.id,
            d.scope if d.agent is None else f"agent {d.agent}",
            ", ".join(d.selected),
            _clip((f"{d.header} · " if d.header else "") + d.question),
            f"{d.by or '-'} via {d.provider}",
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(d.at_ms / 1000)),
            "in " + duration(max(0, d.expires_ms - now_ms) / 1000),
        )
        for d in decisions
    ]
    return "\n".join(table(("ID", "SCOPE", "ANSWER", "QUESTION", "SET BY", "SET (UTC)", "EXPIRES"), rows))


def _clip(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _fail(error: UserQuestionError) -> int:
    print(msgspec.json.encode(error.to_payload()).decode(), file=sys.stderr)
    return EXIT_STATUS.get(error.code, 1)


async def run(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    if args.action == "revoke" and not args.id:
        return _fail(UserQuestionError("revoke needs the decision's ID (see `qbroker decisions list`)", BAD_REQUEST))
    if args.action == "list" and args.id:
        return _fail(UserQuestionError("list takes no ID", BAD_REQUEST))
    try:
        async with settings.broker() as broker:
            if args.action == "revoke":
                by = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
                if not await broker.revoke_decision(args.id, by=by):
                    print(f"no live decision {args.id} in namespace {broker.namespace}", file=sys.stderr)
                    return EXIT_NOT_FOUND
                print(f"revoked {args.id}")
                return 0
            decisions = await broker.decisions()
            now_ms = await Reads(broker).server_time_ms()
    except UserQuestionError as error:
        return _fail(error)
    except (OSError, RedisError) as error:
        return _fail(UserQuestionError(f"Redis is unavailable: {error}", BROKER_UNAVAILABLE))
    if args.json:
        print(msgspec.json.encode(decisions).decode())
    else:
        print(format_decisions(decisions, now_ms))
    return 0
