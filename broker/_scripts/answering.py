"""The bindings of the answering side's scripts: the lease, deliver, settle, approve, and what a provider writes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from .._lua import SCRIPTS
from .reply import Key, Refusal, Reply, ignored, is_ok, is_one, refused, tagged, tagged_or_refused

if TYPE_CHECKING:
    from .._commands import Commands


class Lease(msgspec.Struct, frozen=True, gc=False):
    """lease_acquire.lua's reply: ``epoch`` 0 when another holds the lease (``holder``'s value) for ``remaining_ms``."""

    epoch: int
    remaining_ms: int
    holder: str = ""


def _lease(reply: Sequence[Any]) -> Lease:
    return Lease(int(reply[0]), int(reply[1]), str(reply[2]) if len(reply) > 2 else "")


def lease_acquire(
    commands: Commands,
    *,
    lease: Key,
    epoch: Key,
    standbys: Key,
    handover: Key,
    record: Key,
    token: str,
    name: str,
    ttl: int,
    standby_ttl: int,
) -> Awaitable[Lease]:
    return commands.script(
        SCRIPTS["lease_acquire"], [lease, epoch, standbys, handover, record], [token, name, ttl, standby_ttl], _lease
    )


def lease_renew(
    commands: Commands, *, lease: Key, standbys: Key, record: Key, fence: str, ttl: int, member: str
) -> Awaitable[bool]:
    """lease_renew.lua: True when renewed."""
    return commands.script(SCRIPTS["lease_renew"], [lease, standbys, record], [fence, ttl, member], is_one)


def lease_renew_first(
    commands: Commands,
    *,
    lease: Key,
    standbys: Key,
    record: Key,
    fence: str,
    ttl: int,
    member: str,
    renewed: Callable[[bool], None],
) -> Callable[[], None]:
    """lease_renew.lua sent first in every pipeline after Redis failed (``Commands.lead_after_outage``), its reply
    to ``renewed``: a holder whose lease lapsed in a restart takes it back before any fenced script it queued
    meanwhile is refused for want of it. Returns what stops it."""
    return commands.lead_after_outage(
        SCRIPTS["lease_renew"], [lease, standbys, record], [fence, ttl, member], lambda reply: renewed(is_one(reply))
    )


def lease_release(
    commands: Commands, *, lease: Key, signal: Key, standbys: Key, record: Key, fence: str, member: str
) -> Awaitable[bool]:
    """lease_release.lua: True when released (False: it was not ours)."""
    return commands.script(SCRIPTS["lease_release"], [lease, signal, standbys, record], [fence, member], is_one)


def notice_ack(commands: Commands, *, lease: Key, requests: Key, fence: str, entry: str, group: str) -> Awaitable[bool]:
    """notice_ack.lua: False when the lease is lost (the notice is left for the holder)."""
    return commands.script(SCRIPTS["notice_ack"], [lease, requests], [fence, entry, group], is_ok)


class Delivering(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One entry of a deliver.lua call: its five KEYS, then its three ARGV."""

    request: Key
    record: Key
    liveness: Key
    inbox: Key
    outcome: Key
    entry: str
    rid: str
    want_body: str


class Delivery(msgspec.Struct, frozen=True, gc=False):
    """deliver.lua's reply for one entry: ``kind`` 'ok', 'gone' (``body`` says why) or 'moved' (``client``)."""

    kind: str
    body: str | None = None
    """the request JSON ('' when not asked for, None when the hash had none); for 'gone', why"""
    agent: str = ""
    created_ms: int = 0
    again: str = ""
    away: bool = False
    key: str = ""
    client: str | None = None
    remember: str = ""
    coalesce: str = ""
    deadline_ms: int | None = None


def _delivery(one: Sequence[Any]) -> Delivery:
    kind = one[0]
    if kind != "ok":
        return Delivery(kind, one[1], client=str(one[1]) if kind == "moved" else None)
    return Delivery(
        kind,
        one[1],
        one[2],
        int(one[3]),
        one[4],
        len(one) > 5 and one[5] == "1",
        str(one[6]) if len(one) > 6 else "",
        str(one[7]) if len(one) > 7 else None,
        str(one[8]) if len(one) > 8 and one[8] else "",
        str(one[9]) if len(one) > 9 and one[9] else "",
        int(one[10]) if len(one) > 10 and one[10] else None,
    )


def _delivered(reply: Sequence[Any]) -> list[Delivery] | Refusal:
    return refused(reply) if reply[0] != "ok" else [_delivery(one) for one in reply[1]]


def deliver(
    commands: Commands,
    *,
    lease: Key,
    requests: Key,
    audit: Key,
    away: Key,
    fence: str,
    group: str,
    epoch: int,
    result_ttl: int,
    audit_max: int,
    liveness_grace: int,
    entries: Sequence[Delivering],
) -> Awaitable[list[Delivery] | Refusal]:
    """deliver.lua: a reply per entry, in order, or the refusal of the whole read (LEASE_LOST)."""
    keys = [lease, requests, audit, away]
    argv: list[Any] = [fence, group, epoch, result_ttl, audit_max, liveness_grace]
    for e in entries:
        keys += (e.request, e.record, e.liveness, e.inbox, e.outcome)
        argv += (e.entry, e.rid, e.want_body)
    return commands.script(SCRIPTS["deliver"], keys, argv, _delivered)


class Settlement(msgspec.Struct, kw_only=True):
    """One settlement of a settle.lua call: its KEYS (``request`` to ``decision_keys``), then its ARGV."""

    request: Key
    outcome_key: Key
    inbox: Key
    durable: Key
    """a keyed ask's durable key; the request hash again when unkeyed"""
    decision_keys: list[Key]
    rid: str
    state: str
    outcome: str
    """the outcome JSON; sealed when the call is sent"""
    by: str
    call: str
    asker: str
    asked: str
    """what was asked, for the audit entry (broker/audit.py asked_of; '' for none)"""
    route: str = ""
    """the groups the card was routed to, for the audit entry (a JSON array; '' when the provider does not route)"""
    decisions: list[Any]
    """D, the decisions remembered with it ('-1': another asker of a coalesced card), then five per decision"""


def _settled(reply: Sequence[Any]) -> list[Reply | Refusal] | Refusal:
    return refused(reply) if reply[0] != "ok" else [tagged_or_refused(one) for one in reply[1]]


def settle(
    commands: Commands,
    *,
    lease: Key,
    requests: Key,
    audit: Key,
    decisions: Key,
    decision_expiry: Key,
    fence: str,
    provider: str,
    epoch: int,
    group: str,
    audit_max: int,
    result_ttl: int,
    hold_notices: str,
    settlements: Sequence[Settlement],
) -> Awaitable[list[Reply | Refusal] | Refusal]:
    """settle.lua: a reply per settlement, 'ok' (``value`` a client still to be told, or '') or its refusal; or the
    refusal of the whole call (LEASE_LOST)."""
    keys = [lease, requests, audit, decisions, decision_expiry]
    argv: list[Any] = [fence, provider, epoch, group, audit_max, result_ttl, hold_notices]
    for s in settlements:
        keys += (s.request, s.outcome_key, s.inbox, s.durable, *s.decision_keys)
        argv += (s.rid, s.state, s.outcome, s.by, s.call, s.asker, s.asked, s.route, *s.decisions)
    return commands.script(SCRIPTS["settle"], keys, argv, _settled)


def _votes(reply: Sequence[Any]) -> list[Any] | Refusal:
    if reply[0] != "ok":
        return refused(reply)
    votes: list[Any] = reply[1]
    return votes


def approve(
    commands: Commands,
    *,
    lease: Key,
    request: Key,
    approvals: Key,
    audit: Key,
    fence: str,
    rid: str,
    person: str,
    vote: str,
    ttl: int,
    audit_max: int,
    policy: str,
    verdict: str,
    provider: str,
    epoch: int,
) -> Awaitable[list[Any] | Refusal]:
    """approve.lua: every vote so far and its time, flat (field, value, ...), or the refusal."""
    return commands.script(
        SCRIPTS["approve"],
        [lease, request, approvals, audit],
        [fence, rid, person, vote, ttl, audit_max, policy, verdict, provider, epoch],
        _votes,
    )


def deadletter(
    commands: Commands,
    *,
    requests: Key,
    dead: Key,
    request: Key,
    outcome: Key,
    inbox: Key,
    audit: Key,
    entry: str,
    reason: str,
    group: str,
    dead_max: int,
    result_ttl: int,
    rid: str,
    audit_max: int,
    fields: bytes,
) -> Awaitable[None]:
    """deadletter.lua (its reply is always 'ok')."""
    return commands.script(
        SCRIPTS["deadletter"],
        [requests, dead, request, outcome, inbox, audit],
        [entry, reason, group, dead_max, result_ttl, rid, audit_max, fields],
        ignored,
    )


def decision_revoke(
    commands: Commands,
    *,
    decisions: Key,
    expiry: Key,
    audit: Key,
    decision: Key,
    id: str,
    by: str,
    audit_max: int,
) -> Awaitable[Reply]:
    """decision_revoke.lua: 'ok' | 'gone' | 'moved' (``value`` the key the index names)."""
    return commands.script(
        SCRIPTS["decision_revoke"], [decisions, expiry, audit, decision], [id, by, audit_max], tagged
    )


def audit_append(
    commands: Commands, *, audit: Key, audit_max: int, head: str, fields: Sequence[Any]
) -> Awaitable[Reply]:
    """audit_append.lua: 'ok' (``value`` the entry id) | 'moved' (the current head; nothing written)."""
    return commands.script(SCRIPTS["audit_append"], [audit], [audit_max, head, *fields], tagged)
