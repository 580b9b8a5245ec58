"""One typed binding per Lua script: its KEYS and ARGV by name, in its header's order, and its reply decoded.

A binding's keyword parameters are the names its script's contract header gives ``KEYS[i]`` and
``ARGV[i]``, those annotated ``Key`` being KEYS, in the header's order; a record parameter
(ask.lua's ``AskKeys``, ...) stands for its fields, and a list of records for the items the
header repeats per entry. tests/test_script_bindings.py holds each binding to its header. Values
go to Redis as given: the caller converts durations to ms and flags to the script's strings. A
binding returns ``Commands.script``'s awaitable, which decodes the reply: no coroutine of its own.

A script's ``{'err', CODE, message}`` reply decodes to a ``Refusal``, whose ``error()`` is the
one place such a reply becomes a ``UserQuestionError``.

Records are msgspec Structs, built in C. ask.lua's 29 items come as three records: a call of more
than 14 keyword arguments is compiled into a dict built and unpacked on every call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from ._lua import SCRIPTS
from .errors import UserQuestionError

if TYPE_CHECKING:
    from ._commands import Commands

__all__ = [
    "BINDINGS",
    "AskArgv",
    "AskEnqueue",
    "AskKeys",
    "Asked",
    "Delivering",
    "Delivery",
    "Key",
    "Lease",
    "Refusal",
    "Reply",
    "Settlement",
    "agent_heartbeat",
    "agent_register",
    "approve",
    "ask",
    "audit_append",
    "audit_cursor",
    "away_end",
    "deadletter",
    "decision_revoke",
    "deliver",
    "detach",
    "durable_release",
    "expire",
    "lease_acquire",
    "lease_release",
    "lease_renew",
    "notice_ack",
    "reap",
    "settle",
    "settled_cleanup",
    "standbys_prune",
    "withdraw",
]

Key = Annotated[str, "KEYS"]
"""a binding's parameter that is one of its script's KEYS (every other one is an ARGV)"""


class Refusal(msgspec.Struct, frozen=True, gc=False):
    """A script's ``{'err', CODE, message}``: the call changed nothing."""

    code: str
    message: str

    def error(self) -> UserQuestionError:
        """The coded error this refusal stands for; a new one each call, so that each raise has its own."""
        return UserQuestionError(self.message, self.code)


class Reply(msgspec.Struct, frozen=True, gc=False):
    """A script's tagged reply, ``{kind, value?, detail?}``, each item after the kind as text."""

    kind: str
    value: str = ""
    detail: str = ""


def _refusal(reply: Sequence[Any]) -> Refusal:
    return Refusal(str(reply[1]), str(reply[2]))


def _tagged(reply: Sequence[Any]) -> Reply:
    """The reply of a script that refuses nothing."""
    if len(reply) == 1:
        return Reply(reply[0])
    return Reply(reply[0], str(reply[1]), str(reply[2]) if len(reply) > 2 else "")


def _reply(reply: Sequence[Any]) -> Reply | Refusal:
    return _refusal(reply) if reply[0] == "err" else _tagged(reply)


# -- the asking side --------------------------------------------------------------------------------------------


class Asked(msgspec.Struct, frozen=True, gc=False):
    """ask.lua's reply: ``kind`` 'ok' (``value`` the entry id), 'attached' (the previous client), 'settled' (the
    state), 'retry', or 'decided' (the outcome JSON, the Redis time and the decisions' records)."""

    kind: str
    value: str = ""
    now_ms: int = 0
    records: tuple[str, ...] = ()


def _asked(reply: Sequence[Any]) -> Asked | Refusal:
    kind = reply[0]
    if kind == "err":
        return _refusal(reply)
    if kind == "decided":
        return Asked(
            kind,
            str(reply[1]),
            int(reply[2]) if len(reply) > 2 else 0,
            tuple(reply[3]) if len(reply) > 3 else (),
        )
    return Asked(kind, str(reply[1])) if len(reply) > 1 else Asked(kind)


class AskKeys(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """ask.lua's KEYS, the gate's and the enqueue's."""

    requests: Key
    request: Key
    record: Key
    asklog: Key
    durable: Key
    named: Key


class AskArgv(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """ask.lua's ARGV, the gate's and the enqueue's."""

    rid: str
    body: bytes
    agent: str
    token: str
    client: str
    request_ttl: int
    log_max: int
    timeout: str
    gate_only: str
    token_sha: str
    key: str
    grace: int
    digest: str


class AskEnqueue(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """ask.lua's KEYS and ARGV for an ask that may enqueue (not sent to check the gate only)."""

    outcome: Key
    away: Key
    solo: str
    remember: str
    result_ttl: int
    lease: str
    standbys: str
    questions: Sequence[str]
    decision_keys: Sequence[str]
    attest: str | None = None


def ask(
    commands: Commands, *, keys: AskKeys, argv: AskArgv, enqueue: AskEnqueue | None = None
) -> Awaitable[Asked | Refusal]:
    """ask.lua; without ``enqueue``, the gate only."""
    script_keys = [*msgspec.structs.astuple(keys)]
    script_argv = [*msgspec.structs.astuple(argv)]
    if enqueue is not None:
        e = enqueue
        script_keys += (e.outcome, e.away)
        script_argv += (e.solo, e.remember, e.result_ttl, e.lease, e.standbys, len(e.questions))
        script_argv += (*e.questions, *e.decision_keys)
        if e.attest is not None:
            script_argv.append(e.attest)
    return commands.script(SCRIPTS["ask"], script_keys, script_argv, _asked)


def withdraw(
    commands: Commands,
    *,
    request: Key,
    requests: Key,
    asklog: Key,
    rid: str,
    state: str,
    reason: str,
    group: str,
    log_max: int,
) -> Awaitable[Reply]:
    """withdraw.lua: 'ok' | 'settled' (``value`` the state) | 'gone'."""
    return commands.script(
        SCRIPTS["withdraw"], [request, requests, asklog], [rid, state, reason, group, log_max], _tagged
    )


def detach(
    commands: Commands,
    *,
    request: Key,
    requests: Key,
    away: Key,
    asklog: Key,
    rid: str,
    client: str,
    log_max: int,
    result_ttl: int,
) -> Awaitable[Reply]:
    """detach.lua: 'ok' | 'settled' (``value`` the state) | 'gone' | 'other'."""
    return commands.script(
        SCRIPTS["detach"], [request, requests, away, asklog], [rid, client, log_max, result_ttl], _tagged
    )


def settled_cleanup(
    commands: Commands, *, settled: Sequence[Key], tombstone: int, client: str, unclaimed: str | None = None
) -> None:
    """settled_cleanup.lua, queued with nobody awaiting it; ``settled``: each request's hash, then its outcome key."""
    argv: list[Any] = [tombstone, client] if unclaimed is None else [tombstone, client, unclaimed]
    commands.fire_script(SCRIPTS["settled_cleanup"], list(settled), argv)


def durable_release(commands: Commands, *, durable: Key, rid: str) -> None:
    """durable_release.lua, queued with nobody awaiting it."""
    commands.fire_script(SCRIPTS["durable_release"], [durable], [rid])


def _registered(reply: Sequence[Any]) -> int | Refusal:
    return int(reply[1]) if reply[0] == "ok" else _refusal(reply)


def agent_register(
    commands: Commands,
    *,
    record: Key,
    owner_record: Key,
    agents: Key,
    fingerprint: str,
    owner: str,
    ttl: int,
    check_owner: str,
    agent: str,
    mode: str,
) -> Awaitable[int | Refusal]:
    """agent_register.lua: when this process registered (Redis ms), or the refusal."""
    return commands.script(
        SCRIPTS["agent_register"],
        [record, owner_record, agents],
        [fingerprint, owner, ttl, check_owner, agent, mode],
        _registered,
    )


def _one(reply: Any) -> bool:
    return bool(reply == 1)


def agent_heartbeat(
    commands: Commands,
    *,
    record: Key,
    agents: Key,
    fingerprint: str,
    ttl: int | str,
    agent: str,
    registered: str,
    owner: str,
) -> Awaitable[bool]:
    """agent_heartbeat.lua: True while this process is one of the live instance's."""
    return commands.script(
        SCRIPTS["agent_heartbeat"], [record, agents], [fingerprint, ttl, agent, registered, owner], _one
    )


# -- the answering side -----------------------------------------------------------------------------------------


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
    return commands.script(SCRIPTS["lease_renew"], [lease, standbys, record], [fence, ttl, member], _one)


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
        SCRIPTS["lease_renew"], [lease, standbys, record], [fence, ttl, member], lambda reply: renewed(_one(reply))
    )


def lease_release(
    commands: Commands, *, lease: Key, signal: Key, standbys: Key, record: Key, fence: str, member: str
) -> Awaitable[bool]:
    """lease_release.lua: True when released (False: it was not ours)."""
    return commands.script(SCRIPTS["lease_release"], [lease, signal, standbys, record], [fence, member], _one)


def _ok(reply: Sequence[Any]) -> bool:
    return bool(reply[0] == "ok")


def notice_ack(commands: Commands, *, lease: Key, requests: Key, fence: str, entry: str, group: str) -> Awaitable[bool]:
    """notice_ack.lua: False when the lease is lost (the notice is left for the holder)."""
    return commands.script(SCRIPTS["notice_ack"], [lease, requests], [fence, entry, group], _ok)


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
    return _refusal(reply) if reply[0] != "ok" else [_delivery(one) for one in reply[1]]


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
    decisions: list[Any]
    """D, the decisions remembered with it ('-1': another asker of a coalesced card), then five per decision"""


def _settled(reply: Sequence[Any]) -> list[Reply | Refusal] | Refusal:
    return _refusal(reply) if reply[0] != "ok" else [_reply(one) for one in reply[1]]


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
        argv += (s.rid, s.state, s.outcome, s.by, s.call, s.asker, s.asked, *s.decisions)
    return commands.script(SCRIPTS["settle"], keys, argv, _settled)


def _votes(reply: Sequence[Any]) -> list[Any] | Refusal:
    if reply[0] != "ok":
        return _refusal(reply)
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


def _ignored(reply: Any) -> None:
    return None


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
        _ignored,
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
        SCRIPTS["decision_revoke"], [decisions, expiry, audit, decision], [id, by, audit_max], _tagged
    )


def audit_append(
    commands: Commands, *, audit: Key, audit_max: int, head: str, fields: Sequence[Any]
) -> Awaitable[Reply]:
    """audit_append.lua: 'ok' (``value`` the entry id) | 'moved' (the current head; nothing written)."""
    return commands.script(SCRIPTS["audit_append"], [audit], [audit_max, head, *fields], _tagged)


# -- the maintenance worker -------------------------------------------------------------------------------------


def reap(
    commands: Commands,
    *,
    request: Key,
    requests: Key,
    record: Key,
    liveness: Key,
    inbox: Key,
    outcome: Key,
    audit: Key,
    away: Key,
    rid: str,
    entry: str,
    group: str,
    result_ttl: int,
    audit_max: int,
    liveness_grace: int,
) -> Awaitable[Reply]:
    """reap.lua: 'withdrawn' or 'away' (``value`` why) | 'live' | 'stale' (the state) | 'moved' (the client)."""
    return commands.script(
        SCRIPTS["reap"],
        [request, requests, record, liveness, inbox, outcome, audit, away],
        [rid, entry, group, result_ttl, audit_max, liveness_grace],
        _tagged,
    )


def expire(
    commands: Commands,
    *,
    request: Key,
    requests: Key,
    outcome: Key,
    inbox: Key,
    audit: Key,
    durable: Key | None,
    rid: str,
    group: str,
    result_ttl: int,
    audit_max: int,
) -> Awaitable[Reply]:
    """expire.lua: 'expired' (``value`` a client still to be told, or '') | 'waiting' | 'no-deadline' | 'settled' |
    'gone' | 'keyed' (``value`` the agent id, ``detail`` the key: call again with their durable key)."""
    keys = (
        [request, requests, outcome, inbox, audit]
        if durable is None
        else [request, requests, outcome, inbox, audit, durable]
    )
    return commands.script(SCRIPTS["expire"], keys, [rid, group, result_ttl, audit_max], _tagged)


def away_end(
    commands: Commands,
    *,
    request: Key,
    requests: Key,
    outcome: Key,
    away: Key,
    audit: Key,
    durable: Key | None,
    rid: str,
    group: str,
    audit_max: int,
) -> Awaitable[Reply]:
    """away_end.lua: 'expired' | 'uncollected' | 'waiting' | 'back' | 'collected' | 'gone'."""
    keys = (
        [request, requests, outcome, away, audit]
        if durable is None
        else [request, requests, outcome, away, audit, durable]
    )
    return commands.script(SCRIPTS["away_end"], keys, [rid, group, audit_max], _tagged)


def standbys_prune(commands: Commands, *, standbys: Key) -> Awaitable[int]:
    """standbys_prune.lua: how many registrations it dropped."""
    return commands.script(SCRIPTS["standbys_prune"], [standbys], [], int)


def audit_cursor(commands: Commands, *, cursor: Key, read_from: str, to: str) -> Awaitable[bool]:
    """audit_cursor.lua: True when advanced (False: another worker moved it first)."""
    return commands.script(SCRIPTS["audit_cursor"], [cursor], [read_from, to], bool)


BINDINGS: dict[str, Callable[..., Awaitable[Any] | None]] = {
    "ask": ask,
    "withdraw": withdraw,
    "detach": detach,
    "settled_cleanup": settled_cleanup,
    "durable_release": durable_release,
    "agent_register": agent_register,
    "agent_heartbeat": agent_heartbeat,
    "lease_acquire": lease_acquire,
    "lease_renew": lease_renew,
    "lease_release": lease_release,
    "notice_ack": notice_ack,
    "deliver": deliver,
    "settle": settle,
    "approve": approve,
    "deadletter": deadletter,
    "decision_revoke": decision_revoke,
    "audit_append": audit_append,
    "reap": reap,
    "expire": expire,
    "away_end": away_end,
    "standbys_prune": standbys_prune,
    "audit_cursor": audit_cursor,
}
"""every script's binding, by script name"""
