"""Ending the requests whose asker is gone or whose deadline passed (``reap.lua``, ``expire.lua``,
``away_end.lua``), judged over the requests stream: a whole pass, or paced slices of one.

Unsettled requests are found by walking the requests stream (``XRANGE``): it holds the entry
of every request not yet settled or withdrawn, delivered or not, and nothing else but
withdraw notices and poison entries. ``broker.operating.housekeeping`` is the public face of all this.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .._keys import GROUP
from .._scripts import Reply, away_end
from .._scripts import expire as expire_lua
from .._scripts import reap as reap_lua
from ..settings import Namespace

__all__ = [
    "PASS_SECONDS",
    "SLICE_FLOOR",
    "HousekeepingReport",
    "ask_entries",
    "end_away",
    "expire_overdue",
    "housekeep_slice",
    "pairs",
    "reap_abandoned",
    "redis_time_ms",
    "slice_size",
]

log = logging.getLogger(__name__)

_PAGE = 256
_JUDGED = ("state", "client", "agent", "agent_fp", "away", "deadline")
"""the request hash's fields a paced round reads to tell whether reap.lua or expire.lua has anything to do"""


async def redis_time_ms(broker: Namespace) -> int:
    """Now, unix ms, by the Redis clock (the clock every ``created`` and deadline is judged by)."""
    seconds, micros = await broker.commands.call("TIME")
    return int(seconds) * 1000 + int(micros) // 1000


class _Ending(TypedDict):
    """What every script that ends a request is given (reap.lua, expire.lua, away_end.lua)."""

    request: str
    requests: str
    outcome: str
    audit: str
    rid: str
    group: str
    audit_max: int


def _ending(broker: Namespace, rid: str) -> _Ending:
    keys = broker.keys
    return _Ending(
        request=keys.request(rid),
        requests=keys.requests,
        outcome=keys.outcome(rid),
        audit=keys.audit,
        rid=rid,
        group=GROUP,
        audit_max=broker.settings.audit_maxlen,
    )


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


async def ask_entries(broker: Namespace) -> AsyncIterator[list[tuple[str, dict[str, str]]]]:
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
        fields = pairs(flat)
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
    async for asks in ask_entries(broker):
        await _reap(broker, asks, report)
    if away is not None:
        away += report.away
    return report.withdrawn, report.stale_entries


async def _reap(broker: Namespace, asks: list[tuple[str, dict[str, str]]], report: HousekeepingReport) -> None:
    """Judge each of ``asks`` by ``reap.lua``; what it did goes into ``report``."""
    keys = broker.keys
    settings = broker.settings

    async def reap(entry_id: str, fields: dict[str, str]) -> Reply:
        rid, agent = fields["rid"], fields.get("agent", "")

        async def judged_as(client: str) -> Reply:
            return await reap_lua(
                broker.commands,
                **_ending(broker, rid),
                record=keys.agent(agent) if agent else keys.request(rid),
                liveness=keys.client(client),
                inbox=keys.inbox(client),
                away=keys.away,
                entry=entry_id,
                result_ttl=int(settings.result_ttl * 1000),
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
                away_end(
                    broker.commands,
                    **_ending(broker, rid),
                    away=keys.away,
                    durable=keys.durable(agent or None, key) if key else None,
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
    async for asks in ask_entries(broker):
        await _expire(broker, [fields for _, fields in asks], report)
    return report.expired


async def _expire(broker: Namespace, asks: list[dict[str, str]], report: HousekeepingReport) -> None:
    """Judge each of ``asks`` (stream entry fields) by ``expire.lua``; the ids it expired go into ``report``."""
    keys = broker.keys
    settings = broker.settings

    async def expire(fields: dict[str, str]) -> Reply:
        rid = fields["rid"]

        async def expired_with(durable: str | None) -> Reply:
            return await expire_lua(
                broker.commands,
                **_ending(broker, rid),
                inbox=keys.inbox(fields["client"]),
                durable=durable,
                result_ttl=int(settings.result_ttl * 1000),
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


def pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
