"""The engine of ``qbroker status``: read a namespace's state and print it."""

from __future__ import annotations

import argparse
import sys
import time

import msgspec
from redis.exceptions import RedisError

from broker import NamespaceStatus, UserQuestionError, namespace_status
from broker.errors import BROKER_UNAVAILABLE
from broker.operating.status import PendingInfo
from workers.exits import EXIT_STATUS
from workers.inert import inert
from workers.operating.text_table import duration, table
from workers.settings import Settings

__all__ = ["format_status", "show"]


def format_status(status: NamespaceStatus) -> str:
    """The human form: a summary, then a table per section (the listed part of each)."""
    if status.holder is None:
        provider = "none (asks fail with NO_PROVIDER unless a standby waits)"
    else:
        provider = f"{inert(status.holder)} (epoch {status.epoch}, lease {status.lease_ttl_s or 0:.1f}s left)"
    by_priority = ", ".join(f"{name} {n}" for name, n in status.pending_by_priority.items())
    standbys = ", ".join(
        f"{inert(name)} ({left:.1f}s left)" for name, left in zip(status.standbys, status.standby_ttls_s, strict=False)
    )
    gateways = ", ".join(
        f"{inert(name)} ({left:.1f}s left)" for name, left in zip(status.gateways, status.gateway_ttls_s, strict=False)
    )
    if status.worker is None:
        worker = "none: the lease holder housekeeps (run `qbroker worker` for notifications and metrics)"
    else:
        worker = f"{inert(status.worker)} ({status.worker_ttl_s or 0:.1f}s left)"
    out = [
        f"namespace     {status.namespace}",
        f"provider      {provider}",
        f"standbys      {standbys or 'none'}",
        f"worker        {worker}",
        f"gateways      {gateways + ' (as each says: any asker may write this list)' if gateways else 'none'}",
        f"pending       {status.pending_count}" + (f" ({by_priority})" if by_priority else ""),
        f"live agents   {status.agent_count}",
        f"stream        {status.stream_length} entries",
        f"dead letters  {status.dead_letters}",
    ]
    if status.rejected_answers:
        out.append(
            f"REFUSED       {status.rejected_answers} answers askers refused as unsigned or badly signed "
            "(a forgery, or a provider with an untrusted key: docs/security.md)"
        )
    if status.away_count:
        out.insert(5, f"away askers   {status.away_count} (keyed asks kept for their asker to re-attach)")
    out += [
        "",
        f"pending requests: {status.pending_count}{_shown(len(status.pending), status.pending_count, 'oldest')}",
    ]
    if status.pending:
        rows = [
            (p.request_id, inert(p.agent or "-"), ("verified" if p.verified else "claimed") if p.agent else "-",
             p.priority, duration(p.age_s), str(p.questions),
             f"epoch {p.delivered_epoch}" if p.delivered_epoch else "not yet", _asker(p))
            for p in sorted(status.pending, key=lambda p: -p.age_s)
        ]  # fmt: skip
        out += table(("REQUEST", "AGENT", "IDENTITY", "PRIORITY", "WAITING", "QUESTIONS", "DELIVERED", "ASKER"), rows)
    if status.next_after:
        out.append(f"next page: --after {status.next_after}")
    out += ["", f"live agents: {status.agent_count}{_shown(len(status.agents), status.agent_count, 'first')}"]
    if status.agents:
        agent_rows = [
            (
                inert(a.agent_id),
                inert(a.owner or "- (root: may ask)"),
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(a.since)),
            )
            for a in status.agents
        ]
        out += table(("AGENT", "OWNER", "SINCE (UTC)"), agent_rows)
    return "\n".join(out)


def _shown(listed: int, total: int, which: str) -> str:
    return "" if listed >= total else f", the {which} {listed} below (--limit N shows more, 0 all)"


def _asker(pending: PendingInfo) -> str:
    key = f" (key {inert(pending.key)})" if pending.key else ""
    if pending.away_s is None:
        return "waiting" + key
    left = f", {duration(pending.grace_left_s)} left" if pending.grace_left_s is not None else ""
    return f"away {duration(pending.away_s)}{left}{key}"


async def show(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    try:
        async with settings.broker() as broker:
            status = await namespace_status(broker, limit=args.limit or None, after=args.after or "")
    except UserQuestionError as error:
        print(msgspec.json.encode(error.to_payload()).decode(), file=sys.stderr)
        return EXIT_STATUS.get(error.code, 1)
    except (OSError, RedisError) as error:
        unavailable = UserQuestionError(f"Redis is unavailable: {error}", BROKER_UNAVAILABLE)
        print(msgspec.json.encode(unavailable.to_payload()).decode(), file=sys.stderr)
        return EXIT_STATUS[BROKER_UNAVAILABLE]
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        print(format_status(status))
    return 0
