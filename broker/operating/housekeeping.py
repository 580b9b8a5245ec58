"""Maintenance of a namespace: what a long-running broker needs done when nobody asks.

Each function takes an open :class:`~broker.Broker` (any :class:`Namespace`) and is idempotent:
every check-then-act is one script (``reap.lua``, ``expire.lua``, ``standbys_prune.lua``), so
several maintenance workers may run them at once, and a run interrupted half way is simply run
again. Reaping and expiring (whole passes and paced slices) live in ``broker/operating/_reaping.py``, and
are public here; this module adds the audit's digest, the maintenance workers' bookkeeping and a
provider's own housekeeping while no worker is alive.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from .._scripts import audit_cursor, standbys_prune
from ..settings import Namespace
from ..types import decode_request
from ._reaping import (
    PASS_SECONDS,
    SLICE_FLOOR,
    HousekeepingReport,
    ask_entries,
    end_away,
    expire_overdue,
    housekeep_slice,
    pairs,
    reap_abandoned,
    redis_time_ms,
    slice_size,
)

if TYPE_CHECKING:
    from ..answering.provider import Provider

__all__ = [
    "PASS_SECONDS",
    "SLICE_FLOOR",
    "HousekeepingReport",
    "Namespace",
    "PendingInfo",
    "claim_run",
    "Settled",
    "dead_letter_count",
    "digest_audit",
    "drop_stale_standbys",
    "end_away",
    "expire_overdue",
    "housekeep_slice",
    "housekeep_while_unattended",
    "lease_holder",
    "mark_notified",
    "mark_worker_alive",
    "pending_requests",
    "reap_abandoned",
    "record_run",
    "redis_time_ms",
    "run_housekeeping",
    "runs_key",
    "slice_size",
    "trim_audit",
    "unmark_notified",
    "worker_alive",
]

log = logging.getLogger(__name__)


# Audit events that end a request, and the outcome each one counts as.
_TERMINAL = {
    "answered": "answered",
    "cancelled": "cancelled",
    "withdrawn": "withdrawn",
    "aborted": "aborted",
    "timed_out": "timed_out",
    "expired": "expired",
    "dead-lettered": "failed",
}


@dataclass(frozen=True, kw_only=True)
class PendingInfo:
    """An unsettled request as housekeeping and notifications see it (no agent token, ever)."""

    request_id: str
    agent_id: str | None
    created_ms: int
    """unix ms by the Redis clock"""
    deadline_ms: int | None
    delivered: bool
    """True once a provider was shown it"""
    questions: tuple[str, ...]
    """the question texts, for a notification"""


async def trim_audit(broker: Namespace, maxlen: int | None = None) -> int:
    """Cap the audit stream and the askers' log exactly at ``maxlen`` (the broker's ``audit_maxlen`` by default).

    Not the audit's human record: each decision's own append caps it (at most a stream node over), and that is
    its only trim, so that ``verify`` can tell a decision deleted from its start (broker/audit.py)."""
    limit = broker.settings.audit_maxlen if maxlen is None else maxlen
    trimmed = 0
    for stream in (broker.keys.audit, broker.keys.asklog):
        trimmed += int(await broker.commands.call("XTRIM", stream, "MAXLEN", limit))
    return trimmed


async def drop_stale_standbys(broker: Namespace) -> int:
    """Remove standby registrations that were not refreshed in time; returns how many."""
    return await standbys_prune(broker.commands, standbys=broker.keys.standbys)


async def dead_letter_count(broker: Namespace) -> int:
    """How many poison entries the dead-letter stream holds."""
    count: int = await broker.commands.call("XLEN", broker.keys.dead)
    return count


async def lease_holder(broker: Namespace) -> str | None:
    """The name of the provider that holds the namespace's lease, or None."""
    value: str | None = await broker.commands.call("GET", broker.keys.provider)
    if value is None:
        return None
    parts = value.split(":", 2)
    return parts[2] if len(parts) == 3 else value


async def pending_requests(broker: Namespace) -> list[PendingInfo]:
    """Every unsettled request of the namespace, oldest first."""
    keys = broker.keys
    found: list[PendingInfo] = []
    async for asks in ask_entries(broker):
        rows = await asyncio.gather(
            *(
                broker.commands.call(
                    "HMGET", keys.request(f["rid"]), "state", "agent", "created", "deadline", "delivered", "request"
                )
                for _, f in asks
            )
        )
        for (_, fields), row in zip(asks, rows, strict=True):
            state, agent, created, deadline, delivered, raw = row
            if state != "pending":
                continue
            try:
                questions = tuple(q.question for q in decode_request(raw).questions)
            except (msgspec.DecodeError, TypeError):
                questions = ()
            found.append(
                PendingInfo(
                    request_id=fields["rid"],
                    agent_id=agent or None,
                    created_ms=int(created or 0),
                    deadline_ms=int(deadline) if deadline else None,
                    delivered=bool(delivered),
                    questions=questions,
                )
            )
    return found


async def claim_run(broker: Namespace, job: str, slot: str, *, worker: str, ttl: float) -> bool:
    """Claim scheduled run ``slot`` of ``job`` for this worker; False when another claimed it.

    The claim is a short lock that is never released, only lapses: of several workers that
    were told to run the same slot, one does it once.
    """
    key = f"{broker.keys.prefix}maint:{job}:{slot}"
    claimed = await broker.commands.call("SET", key, worker, "NX", "PX", max(1, int(ttl * 1000)))
    return bool(claimed)


def runs_key(broker: Namespace) -> str:
    """The capped stream of maintenance run reports (kept apart from the audit stream)."""
    return f"{broker.keys.prefix}maintenance"


async def record_run(
    broker: Namespace, job: str, slot: str, *, worker: str, fields: dict[str, str], maxlen: int = 1000
) -> None:
    """Append what a maintenance run did, and which worker did it, to :func:`runs_key`."""
    await broker.commands.call(
        "XADD",
        runs_key(broker),
        "MAXLEN",
        "~",
        maxlen,
        "*",
        "job",
        job,
        "slot",
        slot,
        "worker",
        worker,
        *(item for pair in fields.items() for item in pair),
    )


async def mark_notified(broker: Namespace, request_id: str, level: str, *, ttl: float) -> bool:
    """Mark that ``request_id`` was notified at ``level``; False when it already was (dedup)."""
    key = f"{broker.keys.prefix}notified:{request_id}:{level}"
    return bool(await broker.commands.call("SET", key, "1", "NX", "PX", max(1, int(ttl * 1000))))


async def unmark_notified(broker: Namespace, request_id: str, level: str) -> None:
    """Undo :func:`mark_notified` (the notification could not be queued)."""
    await broker.commands.call("DEL", f"{broker.keys.prefix}notified:{request_id}:{level}")


@dataclass(frozen=True)
class Settled:
    """One request's end, read from the audit stream."""

    request_id: str
    outcome: str
    """answered, cancelled, withdrawn, aborted, timed_out, expired or failed; or rejected, which is not
    an end: its asker refused an answer no trusted key signed for it, and waits on"""
    seconds: float | None
    """from ask to this end, by the Redis clock; None when the ask was not seen"""


async def digest_audit(broker: Namespace, *, batch: int = 1000, pages: int = 10) -> list[Settled] | None:
    """The requests that ended since the last digest, each reported to exactly one caller.

    Read from the askers' log (asks, and the ends askers bring about: withdrawals, decisions),
    then from the audit (the answering side's and housekeeping's ends). Each stream's read
    position is shared by every maintenance worker (a compare-and-set cursor), so a fleet of
    workers counts each end once. Returns None when another worker took both batches. Ask
    times are kept in a sorted set until the request ends (or the request TTL passes).
    """
    keys = broker.keys
    ended: list[Settled] = []
    raced = False
    for stream, cursor in ((keys.asklog, "asklog-cursor"), (keys.audit, "audit-cursor")):
        found = await _digest_stream(broker, stream, f"{keys.prefix}maint:{cursor}", batch, pages)
        if found is None:
            raced = True
        else:
            ended += found
    horizon = await redis_time_ms(broker) - int(broker.settings.request_ttl * 1000)
    await broker.commands.call("ZREMRANGEBYSCORE", f"{keys.prefix}maint:asked", "-inf", horizon)
    return None if raced and not ended else ended


async def _digest_stream(
    broker: Namespace, stream: str, cursor_key: str, batch: int, pages: int
) -> list[Settled] | None:
    asked_key = f"{broker.keys.prefix}maint:asked"
    ended: list[Settled] = []
    for _ in range(pages):
        cursor: str | None = await broker.commands.call("GET", cursor_key)
        page = await broker.commands.call("XRANGE", stream, f"({cursor}" if cursor else "-", "+", "COUNT", batch)
        if not page:
            break
        if not await audit_cursor(broker.commands, cursor=cursor_key, read_from=cursor or "", to=page[-1][0]):
            return ended or None
        asked: dict[str, int] = {}
        ends: list[tuple[str, str, int]] = []
        for entry_id, flat in page:
            fields = pairs(flat)
            rid, event = fields.get("rid", ""), fields.get("event", "")
            at_ms = int(entry_id.split("-", 1)[0])
            if not rid:
                continue
            if event == "asked":
                asked[rid] = at_ms
            elif event == "rejected":  # not an end: an answer its asker refused (unsigned, badly signed)
                ended.append(Settled(rid, "rejected", None))
            elif event in _TERMINAL:
                ends.append((rid, _TERMINAL[event], at_ms))
        earlier = [rid for rid, _, _ in ends if rid not in asked]
        scores = await broker.commands.call("ZMSCORE", asked_key, *earlier) if earlier else []
        started = {rid: int(float(s)) for rid, s in zip(earlier, scores, strict=True) if s is not None}
        started.update(asked)
        for rid, outcome, at_ms in ends:
            begin = started.get(rid)
            ended.append(Settled(rid, outcome, None if begin is None else max(0, at_ms - begin) / 1000))
        finished = {rid for rid, _, _ in ends}
        still_open = {rid: ms for rid, ms in asked.items() if rid not in finished}
        if still_open:
            await broker.commands.call("ZADD", asked_key, *(x for rid, ms in still_open.items() for x in (ms, rid)))
        if earlier:
            await broker.commands.call("ZREM", asked_key, *earlier)
        if len(page) < batch:
            break
    return ended


async def run_housekeeping(
    broker: Namespace, *, audit_maxlen: int | None = None, every: float | None = None
) -> HousekeepingReport:
    """Every housekeeping step once, in order; returns what was done.

    ``every`` None: reap and expire over every unsettled request, and count them (``report.pending``), each
    costing a few commands. Else the run is one of a series ``every`` seconds apart, as a maintenance worker's:
    it reaps and expires one round of a paced pass (:func:`housekeep_slice`), and ``report.pending`` is the
    length of the requests stream (the unsettled requests, and the notices no provider has read yet), in O(1).
    """
    report = HousekeepingReport()
    if every is None:
        report.withdrawn, report.stale_entries = await reap_abandoned(broker, report.away)
        report.expired = await expire_overdue(broker)
    else:
        await housekeep_slice(broker, every, report)
    report.away_ended = await end_away(broker)
    report.audit_trimmed = await trim_audit(broker, audit_maxlen)
    report.standbys_dropped = await drop_stale_standbys(broker)
    report.dead_letters = await dead_letter_count(broker)
    if every is None:
        report.pending = len(await pending_requests(broker))
    else:
        report.pending = int(await broker.commands.call("XLEN", broker.keys.requests))
    return report


async def mark_worker_alive(broker: Namespace, worker: str, *, ttl: float) -> None:
    """Say that maintenance worker ``worker`` runs housekeeping, for ``ttl`` seconds (refreshed each run)."""
    await broker.commands.call("SET", broker.keys.worker_alive, worker, "PX", max(1, int(ttl * 1000)))


async def worker_alive(broker: Namespace) -> bool:
    """Whether some maintenance worker ran within its few last intervals (:func:`mark_worker_alive`)."""
    return bool(await broker.commands.call("EXISTS", broker.keys.worker_alive))


async def housekeep_while_unattended(broker: Namespace, provider: Provider, every: float) -> None:
    """While ``provider`` holds the lease and no maintenance worker is alive, reap, expire and end away asks.

    Without it a killed asker's question looked live on the page for ever, and no away grace ended, unless
    someone ran ``qbroker worker`` (issue 26). The steps are the worker's own idempotent scripts, so a worker
    starting meanwhile, or a fenced holder's last run, does nothing twice. The rest of the worker's run (the
    audit cap, stale standbys, metrics, webhooks) stays the worker's.
    """
    unattended: bool | None = None
    while not provider.lost:
        try:
            alone = not await worker_alive(broker)
            if alone != unattended:
                unattended = alone
                if alone:
                    log.info("no maintenance worker is alive: provider %s runs housekeeping", provider.name)
                else:
                    log.info("a maintenance worker is alive: provider %s leaves housekeeping to it", provider.name)
            if alone:
                await _housekeep(broker, provider, every)
        except Exception as error:
            log.warning("housekeeping by provider %s failed: %r (tried again in %.1fs)", provider.name, error, every)
        await asyncio.sleep(every)


async def _housekeep(broker: Namespace, provider: Provider, every: float) -> None:
    report = HousekeepingReport()
    await housekeep_slice(broker, every, report)
    report.away_ended = await end_away(broker)
    if report.withdrawn or report.expired or report.away or report.away_ended or report.stale_entries:
        fields = report.as_fields()
        for unrun in ("trimmed", "standbys", "dead", "pending"):
            del fields[unrun]
        slot = str(await redis_time_ms(broker))
        await record_run(broker, "housekeeping", slot, worker=f"provider:{provider.name}", fields=fields)
        log.info(
            "housekeeping of %s by provider %s: %s",
            broker.keys.namespace,
            provider.name,
            " ".join(f"{k}={v}" for k, v in fields.items()),
        )
