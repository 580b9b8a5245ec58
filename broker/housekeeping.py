"""Maintenance of a namespace: what a long-running broker needs done when nobody asks.

Each function takes an open :class:`~broker.Broker` (a :class:`Namespace`) and is idempotent: every check-then-act
is one script (``reap.lua``, ``expire.lua``, ``standbys_prune.lua``), so several maintenance
workers may run them at once, and a run interrupted half way is simply run again.

Unsettled requests are found by walking the requests stream (``XRANGE``): it holds the entry
of every request not yet settled or withdrawn, delivered or not, and nothing else but
withdraw notices and poison entries.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from . import _scripts as scripts
from ._commands import Commands
from ._keys import GROUP, Keys
from .settings import BrokerSettings
from .types import decode_request

if TYPE_CHECKING:
    from .provider import Provider

__all__ = [
    "HousekeepingReport",
    "Namespace",
    "PendingInfo",
    "claim_run",
    "Settled",
    "dead_letter_count",
    "digest_audit",
    "drop_stale_standbys",
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


class Namespace(Protocol):
    """What housekeeping needs of an open ``Broker``: its commands, keys and settings."""

    @property
    def commands(self) -> Commands: ...
    @property
    def keys(self) -> Keys: ...
    @property
    def settings(self) -> BrokerSettings: ...


_PAGE = 256
_JUDGED = ("state", "client", "agent", "agent_fp", "away", "deadline")
"""the request hash's fields a paced round reads to tell whether reap.lua or expire.lua has anything to do"""

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


@dataclass(kw_only=True)
class HousekeepingReport:
    """What one housekeeping run did."""

    withdrawn: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    away: list[str] = field(default_factory=list)
    """keyed requests whose asker was found away (kept for their detach grace)"""
    away_ended: list[str] = field(default_factory=list)
    """keyed requests ended because their asker did not come back within the grace"""
    stale_entries: int = 0
    audit_trimmed: int = 0
    standbys_dropped: int = 0
    dead_letters: int = 0
    pending: int = 0

    def as_fields(self) -> dict[str, str]:
        """Flat string fields, for a log line or an audit entry."""
        return {
            "withdrawn": str(len(self.withdrawn)),
            "expired": str(len(self.expired)),
            "away": str(len(self.away)),
            "away_ended": str(len(self.away_ended)),
            "stale": str(self.stale_entries),
            "trimmed": str(self.audit_trimmed),
            "standbys": str(self.standbys_dropped),
            "dead": str(self.dead_letters),
            "pending": str(self.pending),
        }


async def _ask_entries(broker: Namespace) -> AsyncIterator[list[tuple[str, dict[str, str]]]]:
    """Pages of the stream's ``ask`` entries, oldest first: (entry id, fields)."""
    start = "-"
    while True:
        page = await broker.commands.call("XRANGE", broker.keys.requests, start, "+", "COUNT", _PAGE)
        if not page:
            return
        asks = _asks_of(page)
        if asks:
            yield asks
        if len(page) < _PAGE:
            return
        start = "(" + page[-1][0]


def _asks_of(page: Any) -> list[tuple[str, dict[str, str]]]:
    """The ``ask`` entries of an XRANGE reply: (entry id, fields)."""
    asks = []
    for entry_id, flat in page:
        fields = _pairs(flat)
        if fields.get("kind") == "ask" and fields.get("rid") and fields.get("client"):
            asks.append((entry_id, fields))
    return asks


async def reap_abandoned(broker: Namespace, away: list[str] | None = None) -> tuple[list[str], int]:
    """Withdraw requests whose asker is gone; returns (withdrawn request ids, stale entries removed).

    The asker is gone when its agent record expired (or another instance took the id) or its
    process stopped heart-beating its liveness key. A waiting process gets ``CALLER_NOT_LIVE``;
    a provider that showed the request is told to take it down; the audit stream says why.
    A keyed request is kept instead, its asker marked away (its id goes into ``away``).
    Every unsettled request is judged by its script: a whole pass, for a run now and then
    (:func:`housekeep_slice` spreads the same work over rounds).
    """
    report = HousekeepingReport()
    async for asks in _ask_entries(broker):
        await _reap(broker, asks, report)
    if away is not None:
        away += report.away
    return report.withdrawn, report.stale_entries


async def _reap(broker: Namespace, asks: list[tuple[str, dict[str, str]]], report: HousekeepingReport) -> None:
    """Judge each of ``asks`` by ``reap.lua``; what it did goes into ``report``."""
    keys = broker.keys
    settings = broker.settings

    async def reap(entry_id: str, fields: dict[str, str]) -> scripts.Reply:
        rid, agent = fields["rid"], fields.get("agent", "")
        request_key = keys.request(rid)

        async def judged_as(client: str) -> scripts.Reply:
            return await scripts.reap(
                broker.commands,
                request=request_key,
                requests=keys.requests,
                record=keys.agent(agent) if agent else request_key,
                liveness=keys.client(client),
                inbox=keys.inbox(client),
                outcome=keys.outcome(rid),
                audit=keys.audit,
                away=keys.away,
                rid=rid,
                entry=entry_id,
                group=GROUP,
                result_ttl=int(settings.result_ttl * 1000),
                audit_max=settings.audit_maxlen,
                liveness_grace=int(settings.liveness_grace * 1000),
            )

        # The entry's client is who asked first; the hash names who asks now (a keyed ask re-attached): reap.lua
        # says 'moved' when they differ, and is called again with the hash's.
        reply = await judged_as(fields["client"])
        for _ in range(2):
            if reply.kind != "moved":
                break
            reply = await judged_as(reply.value)
        return reply

    calls = [reap(entry_id, fields) for entry_id, fields in asks]
    for (_, fields), reply in zip(asks, await asyncio.gather(*calls), strict=True):
        if reply.kind == "withdrawn":
            report.withdrawn.append(fields["rid"])
            _log_end(broker, "withdrew", fields, reply.value)
        elif reply.kind == "stale":
            report.stale_entries += 1
        elif reply.kind == "away":
            report.away.append(fields["rid"])


async def end_away(broker: Namespace) -> list[str]:
    """End keyed requests whose asker stayed away past its detach grace; returns their ids."""
    keys = broker.keys
    now_ms = await redis_time_ms(broker)
    ended: list[str] = []
    while True:
        due = await broker.commands.call("ZRANGE", keys.away, "-inf", now_ms, "BYSCORE", "LIMIT", 0, _PAGE)
        if not due:
            return ended
        # a request's agent and key never change: its durable key, read first, is released when it ends
        named = await asyncio.gather(*(broker.commands.call("HMGET", keys.request(rid), "agent", "key") for rid in due))
        replies = await asyncio.gather(
            *(
                scripts.away_end(
                    broker.commands,
                    request=keys.request(rid),
                    requests=keys.requests,
                    outcome=keys.outcome(rid),
                    away=keys.away,
                    audit=keys.audit,
                    durable=keys.durable(agent or None, key) if key else None,
                    rid=rid,
                    group=GROUP,
                    audit_max=broker.settings.audit_maxlen,
                )
                for rid, (agent, key) in zip(due, named, strict=True)
            )
        )
        for rid, reply in zip(due, replies, strict=True):
            if reply.kind == "expired":
                ended.append(rid)
                log.info("request %s in %s ended: its asker stayed away past the grace", rid, keys.namespace)
        if len(due) < _PAGE or all(reply.kind == "waiting" for reply in replies):
            return ended


async def expire_overdue(broker: Namespace) -> list[str]:
    """Settle requests past their deadline with ``ASK_TIMED_OUT``; returns their ids."""
    report = HousekeepingReport()
    async for asks in _ask_entries(broker):
        await _expire(broker, [fields for _, fields in asks], report)
    return report.expired


async def _expire(broker: Namespace, asks: list[dict[str, str]], report: HousekeepingReport) -> None:
    """Judge each of ``asks`` (stream entry fields) by ``expire.lua``; the ids it expired go into ``report``."""
    keys = broker.keys
    settings = broker.settings

    async def expire(fields: dict[str, str]) -> scripts.Reply:
        rid = fields["rid"]

        async def expired_with(durable: str | None) -> scripts.Reply:
            return await scripts.expire(
                broker.commands,
                request=keys.request(rid),
                requests=keys.requests,
                outcome=keys.outcome(rid),
                inbox=keys.inbox(fields["client"]),
                audit=keys.audit,
                durable=durable,
                rid=rid,
                group=GROUP,
                result_ttl=int(settings.result_ttl * 1000),
                audit_max=settings.audit_maxlen,
            )

        reply = await expired_with(None)
        if reply.kind == "keyed":  # past its deadline: again with its durable key, released as it ends
            reply = await expired_with(keys.durable(reply.value or None, reply.detail))
        return reply

    calls = [expire(fields) for fields in asks]
    for fields, reply in zip(asks, await asyncio.gather(*calls), strict=True):
        if reply.kind == "expired":
            if reply.value:  # a keyed ask re-attached from another process: tell that one
                inbox = keys.inbox(reply.value)
                await broker.commands.call("RPUSH", inbox, fields["rid"])
                await broker.commands.call("PEXPIRE", inbox, int(settings.result_ttl * 1000))
            report.expired.append(fields["rid"])
            _log_end(broker, "expired", fields, "its deadline passed")


def _log_end(broker: Namespace, done: str, fields: dict[str, str], why: str) -> None:
    agent = fields.get("agent") or "-"
    log.info("%s request %s of agent %s in %s: %s", done, fields["rid"], agent, broker.keys.namespace, why)


PASS_SECONDS = 120.0
"""a paced pass (:func:`housekeep_slice`) looks at every unsettled request within about this many seconds"""
SLICE_FLOOR = _PAGE
"""the fewest stream entries a paced round takes: up to this many unsettled requests, every round is a whole pass"""


def slice_size(length: int, every: float) -> int:
    """Stream entries per round for rounds ``every`` seconds apart over ``length`` entries: a pass in PASS_SECONDS."""
    return max(SLICE_FLOOR, math.ceil(length * every / PASS_SECONDS))


async def housekeep_slice(broker: Namespace, every: float, report: HousekeepingReport) -> bool:
    """One round of a paced pass over the unsettled requests, for rounds ``every`` seconds apart; True: a pass ended.

    Reaping and expiring every request each round cost O(pending) commands a round (20 700 a second at
    100 000 waiting, rounds 3 s apart: docs/maintenance.md). A round takes instead the next
    :func:`slice_size` entries of the requests stream after a cursor kept in Redis (``Keys.reap_cursor``: the
    lease holder and the maintenance workers go on with one pass), so every request is looked at in any
    ceil(PASS_SECONDS / ``every``) + 1 rounds in a row. A request costs one HMGET a pass; one liveness read per
    asking process and agent in the slice tells whose asker looks gone, and only those (and the away, settled,
    missing and overdue) go to ``reap.lua`` and ``expire.lua``, which judge again, atomically: the read decides
    what to ask, never what is done.
    """
    keys = broker.keys
    cursor, length = await asyncio.gather(
        broker.commands.call("GET", keys.reap_cursor), broker.commands.call("XLEN", keys.requests)
    )
    size = slice_size(int(length), every)
    page = await broker.commands.call("XRANGE", keys.requests, f"({cursor}" if cursor else "-", "+", "COUNT", size)
    if len(page) < size:
        await broker.commands.call("DEL", keys.reap_cursor)
    else:
        keep = int(3 * max(PASS_SECONDS, every) * 1000)  # outlives a round's gap; gone with an abandoned namespace
        await broker.commands.call("SET", keys.reap_cursor, page[-1][0], "PX", keep)
    asks = _asks_of(page)
    if asks:
        await _judge(broker, asks, report)
    return len(page) < size


async def _judge(broker: Namespace, asks: list[tuple[str, dict[str, str]]], report: HousekeepingReport) -> None:
    """Reap and expire those of ``asks`` that may need it, by the same reading of the asker's liveness as reap.lua."""
    keys = broker.keys
    now_ms, *rows = await asyncio.gather(
        redis_time_ms(broker),
        *(broker.commands.call("HMGET", keys.request(f["rid"]), *_JUDGED) for _, f in asks),
    )
    pending = [row for row in rows if row[0] == "pending"]
    clients = sorted({row[1] for row in pending if row[1]})
    agents = sorted({(row[2], row[3] or "") for row in pending if row[2]})
    replies = await asyncio.gather(
        *(broker.commands.call("EXISTS", keys.client(client)) for client in clients),
        *(broker.commands.call("HGET", keys.agent(agent), f"p:{fp}") for agent, fp in agents),
    )
    live_clients = {client for client, exists in zip(clients, replies[: len(clients)], strict=True) if exists}
    live_agents = {
        agent for agent, beat in zip(agents, replies[len(clients) :], strict=True) if float(beat or 0) >= now_ms
    }
    to_reap: list[tuple[str, dict[str, str]]] = []
    to_expire: list[dict[str, str]] = []
    for (entry_id, fields), (state, client, agent, fp, away, deadline) in zip(asks, rows, strict=True):
        if state != "pending":
            to_reap.append((entry_id, fields))  # stale: reap.lua removes the entry (and tells a missing one's asker)
            continue
        gone = client not in live_clients or (agent and (agent, fp or "") not in live_agents)
        if gone or away:
            to_reap.append((entry_id, fields))
        if deadline and int(deadline) <= now_ms:
            to_expire.append(fields)
    if to_reap:
        await _reap(broker, to_reap, report)
    if to_expire:
        await _expire(broker, to_expire, report)


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
    return await scripts.standbys_prune(broker.commands, standbys=broker.keys.standbys)


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


async def redis_time_ms(broker: Namespace) -> int:
    """Now, unix ms, by the Redis clock (the clock every ``created`` and deadline is judged by)."""
    seconds, micros = await broker.commands.call("TIME")
    return int(seconds) * 1000 + int(micros) // 1000


async def pending_requests(broker: Namespace) -> list[PendingInfo]:
    """Every unsettled request of the namespace, oldest first."""
    keys = broker.keys
    found: list[PendingInfo] = []
    async for asks in _ask_entries(broker):
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
        if not await scripts.audit_cursor(broker.commands, cursor=cursor_key, read_from=cursor or "", to=page[-1][0]):
            return ended or None
        asked: dict[str, int] = {}
        ends: list[tuple[str, str, int]] = []
        for entry_id, flat in page:
            fields = _pairs(flat)
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


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
