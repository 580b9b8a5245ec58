"""A read-only snapshot of one namespace: who provides, what waits, who may ask.

With a ``limit``, the snapshot lists the oldest ``limit`` pending requests and the first ``limit``
agents, and counts all of them: a namespace with 100 000 questions waiting reads in a tenth of
the time and prints a page, not megabytes.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

import msgspec

from .._keys import Keys
from ..signing import TrustedKeys

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["AgentInfo", "NamespaceStatus", "PendingInfo", "mark_gateway_alive", "mark_gateway_gone", "namespace_status"]

_PAGE = 1000


class _Priority(msgspec.Struct):
    """What the count of pending requests reads of a request beyond the listed ones."""

    priority: str = "normal"


_priority_of = msgspec.json.Decoder(_Priority).decode


class PendingInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A request waiting for an answer."""

    request_id: str
    agent: str | None
    age_s: float
    """seconds since it was asked, by the Redis clock"""
    questions: int
    delivered_epoch: int | None = None
    """the lease epoch under which a provider took it, if one did"""
    key: str | None = None
    """the key of a keyed ask (``ask(..., key=)``)"""
    away_s: float | None = None
    """for a keyed ask whose asker stopped: seconds since; it can still be answered"""
    grace_left_s: float | None = None
    """for an away asker: seconds left to re-attach before the request ends as expired"""
    priority: str = "normal"
    """the request's priority: urgent, normal or low"""
    verified: bool = False
    """a gateway the reader pins attested its agent id for this request; else the id is only claimed"""
    entry: str = ""
    """its entry in the request stream: the cursor to list the pending requests after it (``after=``)"""


class AgentInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A live agent instance (its token never leaves Redis; it is not shown)."""

    agent_id: str
    owner: str | None
    since: int
    """unix seconds of its registration"""


class NamespaceStatus(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    holder: str | None
    """the name of the provider holding the lease, None when nobody does"""
    epoch: int | None
    lease_ttl_s: float | None
    """seconds left on the lease"""
    standbys: tuple[str, ...]
    pending: tuple[PendingInfo, ...]
    agents: tuple[AgentInfo, ...]
    stream_length: int
    dead_letters: int
    last_epoch: int = 0
    """the epoch counter: how many times the lease was taken"""
    pending_count: int = 0
    """every pending request (past the listed ones, counted from the request stream); ``pending``
    lists the oldest ``limit`` of them"""
    pending_by_priority: dict[str, int] = msgspec.field(default_factory=dict)
    """every pending request, counted by priority"""
    away_count: int = 0
    """keyed requests whose asker stopped (from the away index: one may have ended a moment ago)"""
    agent_count: int = 0
    """every live agent; ``agents`` lists the first ``limit`` of them by id"""
    rejected_answers: int = 0
    """answers askers refused among the askers' log's last 1000 events (unsigned or badly signed)"""
    next_after: str | None = None
    """when more pending requests follow the listed ones: the cursor for the next page (``after=``)"""
    standby_ttls_s: tuple[float, ...] = ()
    """each standby's seconds left before it counts as gone unless it beats again, as ``standbys``"""
    worker: str | None = None
    """the maintenance worker that marked itself alive (``qbroker worker``); None: the lease holder housekeeps"""
    worker_ttl_s: float | None = None
    """seconds left on the worker's mark: it renews it every round, so a killed worker's runs out"""
    gateways: tuple[str, ...] = ()
    """the gateways that beat within their last few intervals, as they name themselves (an asker may write this)"""
    gateway_ttls_s: tuple[float, ...] = ()
    """each gateway's seconds left before it counts as gone unless it beats again, as ``gateways``"""


_REJECTED_WINDOW = 1000
"""askers' log events searched for refused answers"""


async def namespace_status(broker: Broker, *, limit: int | None = None, after: str = "") -> NamespaceStatus:
    """Read the namespace's state; writes nothing. Pending requests are read from the stream.

    ``limit``: list only the oldest ``limit`` pending requests and the first ``limit`` agents
    (the counts still cover all); None lists everything. ``after``: list the pending requests
    after this cursor (a listed request's ``entry``, or the last page's ``next_after``).
    """
    call = broker.commands.call
    keys: Keys = broker.keys
    seconds, micros = await call("TIME")
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    (
        lease,
        pttl,
        last_epoch,
        standbys,
        stream_length,
        dead_letters,
        away,
        worker,
        worker_pttl,
        gateways,
    ) = await asyncio.gather(
        call("GET", keys.provider),
        call("PTTL", keys.provider),
        call("GET", keys.epoch),
        call("ZRANGEBYSCORE", keys.standbys, now_ms, "+inf", "WITHSCORES"),
        call("XLEN", keys.requests),
        call("XLEN", keys.dead),
        call("ZCARD", keys.away),
        call("GET", keys.worker_alive),
        call("PTTL", keys.worker_alive),
        call("ZRANGEBYSCORE", keys.gateways, now_ms, "+inf", "WITHSCORES"),
    )
    recent = await call("XREVRANGE", keys.asklog, "+", "-", "COUNT", _REJECTED_WINDOW)
    holder = epoch = None
    holder_member = ""
    if lease:
        epoch_text, token, holder = str(lease).split(":", 2)
        epoch = int(epoch_text)
        holder_member = f"{token}:{holder}"  # the holder registers beside the standbys
    # A standby's score is when it counts as gone unless it beats again (the holder registers beside them).
    standing_by = [(m, expires) for m, expires in zip(standbys[::2], standbys[1::2], strict=True) if m != holder_member]
    pending, counts, next_after = await _pending(call, keys, now_ms, limit, after, broker.gateway_keys)
    agents, agent_count = await _agents(call, keys, now_ms, limit)
    return NamespaceStatus(
        namespace=keys.namespace,
        holder=holder,
        epoch=epoch,
        lease_ttl_s=int(pttl) / 1000 if lease and int(pttl) >= 0 else None,
        standbys=tuple(str(member).split(":", 1)[-1] for member, _ in standing_by),
        standby_ttls_s=tuple(max(0.0, (float(expires) - now_ms) / 1000) for _, expires in standing_by),
        worker=str(worker) if worker else None,
        gateways=tuple(str(name) for name in gateways[::2]),
        gateway_ttls_s=tuple(max(0.0, (float(expires) - now_ms) / 1000) for expires in gateways[1::2]),
        worker_ttl_s=int(worker_pttl) / 1000 if worker and int(worker_pttl) >= 0 else None,
        pending=pending,
        agents=agents,
        stream_length=int(stream_length),
        dead_letters=int(dead_letters),
        last_epoch=int(last_epoch or 0),
        pending_count=counts.total,
        pending_by_priority={priority: n for priority, n in counts.by_priority.items() if n},
        away_count=int(away),
        agent_count=agent_count,
        rejected_answers=sum(1 for _, fields in recent if _event(fields) == "rejected"),
        next_after=next_after,
    )


async def mark_gateway_alive(broker: Broker, name: str, *, ttl: float) -> None:
    """Say that gateway ``name`` runs, for ``ttl`` seconds (by the Redis clock); gateways past theirs are dropped."""
    seconds, micros = await broker.commands.call("TIME")
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    ttl_ms = max(1, int(ttl * 1000))
    await asyncio.gather(
        broker.commands.call("ZADD", broker.keys.gateways, now_ms + ttl_ms, name),
        broker.commands.call("ZREMRANGEBYSCORE", broker.keys.gateways, "-inf", now_ms),
        broker.commands.call("PEXPIRE", broker.keys.gateways, ttl_ms),  # gone with the last gateway
    )


async def mark_gateway_gone(broker: Broker, name: str) -> None:
    """A gateway that stops cleanly leaves the list at once (a killed one lapses with its beat)."""
    await broker.commands.call("ZREM", broker.keys.gateways, name)


class _Counts:
    def __init__(self) -> None:
        self.total = 0
        self.by_priority: dict[str, int] = {"urgent": 0, "normal": 0, "low": 0}

    def add(self, priority: str) -> None:
        self.total += 1
        self.by_priority[priority] = self.by_priority.get(priority, 0) + 1


async def _pending(
    call: Any, keys: Keys, now_ms: int, limit: int | None, after: str, gateways: TrustedKeys
) -> tuple[tuple[PendingInfo, ...], _Counts, str | None]:
    """The oldest ``limit`` pending requests after the cursor in full, every pending request counted,
    and the cursor after the last listed when more follow.

    Past the listed ones, a request is counted from its stream entry alone (every script that
    ends a request deletes its entry, and the entry carries a copy of the request, for its
    priority): no read per request beyond the stream's pages.
    """
    found: list[PendingInfo] = []
    counts = _Counts()
    start = "-"
    more = False
    while True:
        entries = await call("XRANGE", keys.requests, start, "+", "COUNT", _PAGE)
        asks = [
            {**fields, "": entry_id}
            for entry_id, fields in ((entry_id, _pairs(flat)) for entry_id, flat in entries)
            if fields.get("kind") == "ask" and fields.get("rid")
        ]
        before = sum(1 for fields in asks if after and _ordered(fields[""]) <= _ordered(after))
        listing = len(asks) - before if limit is None else max(0, min(len(asks) - before, limit - len(found)))
        listed_asks = asks[before : before + listing]
        listed, counted = [fields["rid"] for fields in listed_asks], asks[:before] + asks[before + listing :]
        more = more or len(asks) > before + listing
        entries_of = {fields["rid"]: fields for fields in listed_asks}
        records = await asyncio.gather(
            *(
                call(
                    "HMGET",
                    keys.request(rid),
                    "state",
                    "agent",
                    "created",
                    "delivered",
                    "request",
                    "key",
                    "away",
                    "client",
                )
                for rid in listed
            ),
            *(call("ZSCORE", keys.away, rid) for rid in listed),
            *(call("HGET", keys.request(fields["rid"]), "request") for fields in counted if "request" not in fields),
        )  # issued together: one round trip
        details, graces, bodies = records[:listing], records[listing : 2 * listing], iter(records[2 * listing :])
        for request_id, record, grace_ends in zip(listed, details, graces, strict=True):
            state, agent, created, delivered, request, key, away, client = record
            if state != "pending":
                continue
            try:
                body = msgspec.json.decode(request or "{}")
                questions, priority = len(body.get("questions", ())), str(body.get("priority", "normal"))
            except (msgspec.DecodeError, AttributeError, TypeError):
                questions, priority = 0, "normal"
            counts.add(priority)
            found.append(
                PendingInfo(
                    request_id=request_id,
                    agent=agent or None,
                    age_s=max(0, now_ms - int(created or now_ms)) / 1000,
                    questions=questions,
                    delivered_epoch=int(delivered) if delivered else None,
                    key=key or None,
                    away_s=max(0, now_ms - int(away)) / 1000 if away else None,
                    grace_left_s=max(0, float(grace_ends) - now_ms) / 1000 if away and grace_ends else None,
                    priority=priority,
                    verified=_attested(gateways, keys, request_id, entries_of[request_id], request, agent, client),
                    entry=entries_of[request_id][""],
                )
            )
        for fields in counted:
            counts.add(_priority(fields["request"] if "request" in fields else next(bodies)))
        if len(entries) < _PAGE:
            return tuple(found), counts, found[-1].entry if more and found else None
        start = "(" + entries[-1][0]


def _ordered(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a number pair: ids compare by time, then sequence (not as text)."""
    milliseconds, _, sequence = entry_id.partition("-")
    try:
        return int(milliseconds), int(sequence or 0)
    except ValueError:
        return (0, 0)


def _priority(request: str | None) -> str:
    try:
        return _priority_of(request or "{}").priority
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "normal"


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))


async def _agents(call: Any, keys: Keys, now_ms: int, limit: int | None) -> tuple[tuple[AgentInfo, ...], int]:
    """The first ``limit`` live agents by id, from the agents index (no SCAN: an ACL user fenced to
    its namespace may not), and how many the index holds."""
    names = sorted(await call("ZRANGEBYSCORE", keys.agents, now_ms, "+inf"))
    found: list[AgentInfo] = []
    for start in range(0, len(names), _PAGE):
        if limit is not None and len(found) >= limit:
            break
        page = names[start : start + _PAGE]
        records = await asyncio.gather(*(call("HMGET", keys.agent(name), "owner", "since") for name in page))
        found += [
            AgentInfo(agent_id=name, owner=owner or None, since=int(since))
            for name, (owner, since) in zip(page, records, strict=True)
            if since is not None  # expired since the index was last refreshed
        ]
    return tuple(found if limit is None else found[:limit]), len(names)


def _event(fields: Any) -> str | None:
    if isinstance(fields, dict):
        return fields.get("event")
    return next((fields[i + 1] for i in range(0, len(fields) - 1, 2) if fields[i] == "event"), None)


def _attested(
    gateways: TrustedKeys,
    keys: Keys,
    request_id: str,
    entry: dict[str, str],
    request: str | None,
    agent: str,
    client: str,
) -> bool:
    """As the provider judges it: the entry's attestation, for the request as shown, its agent and asking process."""
    shown = entry.get("request") or request
    if not gateways or not entry.get("attest") or not shown or not agent or not client:
        return False
    return gateways.verify_attestation(
        entry["attest"],
        namespace=keys.namespace,
        request_id=request_id,
        request_sha=hashlib.sha256(shown.encode()).hexdigest(),
        agent=agent,
        client=client,
    )
