"""One typed binding per Lua script: its KEYS and ARGV by name, in its header's order, and its reply decoded.

A binding's keyword parameters are the names its script's contract header gives ``KEYS[i]`` and
``ARGV[i]`` (those annotated ``Key`` are KEYS), in that order; a sequence parameter is a list
the header describes after them. tests/test_script_bindings.py holds each binding to its header.
Values go to Redis as given: the caller converts durations to ms, flags to the script's strings.

A script's ``{'err', CODE, message}`` reply decodes to a ``Refusal``, whose ``error()`` is the
one place such a reply becomes a ``UserQuestionError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

from ._lua import SCRIPTS
from .errors import UserQuestionError

if TYPE_CHECKING:
    from ._commands import Commands

__all__ = [
    "BINDINGS",
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


class Refusal(NamedTuple):
    """A script's ``{'err', CODE, message}``: the call changed nothing."""

    code: str
    message: str

    def error(self) -> UserQuestionError:
        """The coded error this refusal stands for; a new one each call, so that each raise has its own."""
        return UserQuestionError(self.message, self.code)


class Reply(NamedTuple):
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


class Asked(NamedTuple):
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


async def ask(
    commands: Commands,
    *,
    requests: Key,
    request: Key,
    record: Key,
    asklog: Key,
    durable: Key,
    named: Key,
    outcome: Key | None,
    away: Key | None,
    rid: str,
    body: bytes,
    agent: str,
    token: str,
    client: str,
    request_ttl: int,
    log_max: int,
    timeout: str,
    gate_only: str,
    token_sha: str,
    key: str,
    grace: int,
    digest: str,
    solo: str = "",
    remember: str = "",
    result_ttl: int = 0,
    lease: str = "",
    standbys: str = "",
    questions: Sequence[str] = (),
    decision_keys: Sequence[str] = (),
    attest: str | None = None,
) -> Asked | Refusal:
    """ask.lua; ``outcome`` and ``away`` None: the gate only (ARGV from ``solo`` on are not sent)."""
    if outcome is None or away is None:
        reply = await commands.script(
            SCRIPTS["ask"],
            [requests, request, record, asklog, durable, named],
            [rid, body, agent, token, client, request_ttl, log_max, timeout, gate_only, token_sha, key, grace, digest],
        )
        return _asked(reply)
    argv = [rid, body, agent, token, client, request_ttl, log_max, timeout, gate_only, token_sha, key, grace, digest]
    argv += (solo, remember, result_ttl, lease, standbys, len(questions), *questions, *decision_keys)
    if attest is not None:
        argv.append(attest)
    reply = await commands.script(
        SCRIPTS["ask"], [requests, request, record, asklog, durable, named, outcome, away], argv
    )
    return _asked(reply)


async def withdraw(
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
) -> Reply:
    """withdraw.lua: 'ok' | 'settled' (``value`` the state) | 'gone'."""
    reply = await commands.script(
        SCRIPTS["withdraw"], [request, requests, asklog], [rid, state, reason, group, log_max]
    )
    return _tagged(reply)


async def detach(
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
) -> Reply:
    """detach.lua: 'ok' | 'settled' (``value`` the state) | 'gone' | 'other'."""
    reply = await commands.script(
        SCRIPTS["detach"], [request, requests, away, asklog], [rid, client, log_max, result_ttl]
    )
    return _tagged(reply)


def settled_cleanup(
    commands: Commands, *, settled: Sequence[Key], tombstone: int, client: str, unclaimed: str | None = None
) -> None:
    """settled_cleanup.lua, queued with nobody awaiting it; ``settled``: each request's hash, then its outcome key."""
    argv: list[Any] = [tombstone, client] if unclaimed is None else [tombstone, client, unclaimed]
    commands.fire_script(SCRIPTS["settled_cleanup"], list(settled), argv)


def durable_release(commands: Commands, *, durable: Key, rid: str) -> None:
    """durable_release.lua, queued with nobody awaiting it."""
    commands.fire_script(SCRIPTS["durable_release"], [durable], [rid])


async def agent_register(
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
) -> int | Refusal:
    """agent_register.lua: when this process registered (Redis ms), or the refusal."""
    reply = await commands.script(
        SCRIPTS["agent_register"], [record, owner_record, agents], [fingerprint, owner, ttl, check_owner, agent, mode]
    )
    return int(reply[1]) if reply[0] == "ok" else _refusal(reply)


async def agent_heartbeat(
    commands: Commands,
    *,
    record: Key,
    agents: Key,
    fingerprint: str,
    ttl: int | str,
    agent: str,
    registered: str,
    owner: str,
) -> bool:
    """agent_heartbeat.lua: True while this process is one of the live instance's."""
    reply = await commands.script(
        SCRIPTS["agent_heartbeat"], [record, agents], [fingerprint, ttl, agent, registered, owner]
    )
    return bool(reply == 1)


# -- the answering side -----------------------------------------------------------------------------------------


class Lease(NamedTuple):
    """lease_acquire.lua's reply: ``epoch`` 0 when another holds the lease (``holder``'s value) for ``remaining_ms``."""

    epoch: int
    remaining_ms: int
    holder: str = ""


async def lease_acquire(
    commands: Commands,
    *,
    lease: Key,
    epoch: Key,
    standbys: Key,
    handover: Key,
    token: str,
    name: str,
    ttl: int,
    standby_ttl: int,
) -> Lease:
    reply = await commands.script(
        SCRIPTS["lease_acquire"], [lease, epoch, standbys, handover], [token, name, ttl, standby_ttl]
    )
    return Lease(int(reply[0]), int(reply[1]), str(reply[2]) if len(reply) > 2 else "")


async def lease_renew(commands: Commands, *, lease: Key, standbys: Key, fence: str, ttl: int, member: str) -> bool:
    """lease_renew.lua: True when renewed."""
    return bool(await commands.script(SCRIPTS["lease_renew"], [lease, standbys], [fence, ttl, member]) == 1)


async def lease_release(commands: Commands, *, lease: Key, signal: Key, standbys: Key, fence: str, member: str) -> bool:
    """lease_release.lua: True when released (False: it was not ours)."""
    return bool(await commands.script(SCRIPTS["lease_release"], [lease, signal, standbys], [fence, member]) == 1)


async def notice_ack(commands: Commands, *, lease: Key, requests: Key, fence: str, entry: str, group: str) -> bool:
    """notice_ack.lua: False when the lease is lost (the notice is left for the holder)."""
    reply = await commands.script(SCRIPTS["notice_ack"], [lease, requests], [fence, entry, group])
    return bool(reply[0] == "ok")


class Delivering(NamedTuple):
    """One entry of a deliver.lua call: its five KEYS, then its three ARGV."""

    request: Key
    record: Key
    liveness: Key
    inbox: Key
    outcome: Key
    entry: str
    rid: str
    want_body: str


class Delivery(NamedTuple):
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


async def deliver(
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
) -> list[Delivery] | Refusal:
    """deliver.lua: a reply per entry, in order, or the refusal of the whole read (LEASE_LOST)."""
    keys = [lease, requests, audit, away]
    argv: list[Any] = [fence, group, epoch, result_ttl, audit_max, liveness_grace]
    for entry in entries:
        keys += entry[:5]
        argv += entry[5:]
    reply = await commands.script(SCRIPTS["deliver"], keys, argv)
    if reply[0] != "ok":
        return _refusal(reply)
    return [_delivery(one) for one in reply[1]]


@dataclass(slots=True)
class Settlement:
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
    decisions: list[Any]
    """D, the decisions remembered with it ('-1': another asker of a coalesced card), then five per decision"""


async def settle(
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
) -> list[Reply | Refusal]:
    """settle.lua: a reply per settlement, 'ok' (``value`` a client still to be told, or '') or its refusal; the
    refusal of the whole call (LEASE_LOST) as each one's."""
    keys = [lease, requests, audit, decisions, decision_expiry]
    argv: list[Any] = [fence, provider, epoch, group, audit_max, result_ttl, hold_notices]
    for s in settlements:
        keys += (s.request, s.outcome_key, s.inbox, s.durable, *s.decision_keys)
        argv += (s.rid, s.state, s.outcome, s.by, s.call, s.asker, *s.decisions)
    reply = await commands.script(SCRIPTS["settle"], keys, argv)
    if reply[0] != "ok":
        return [_refusal(reply)] * len(settlements)
    return [_reply(one) for one in reply[1]]


async def approve(
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
) -> list[Any] | Refusal:
    """approve.lua: every vote so far and its time, flat (field, value, ...), or the refusal."""
    reply = await commands.script(
        SCRIPTS["approve"],
        [lease, request, approvals, audit],
        [fence, rid, person, vote, ttl, audit_max, policy, verdict, provider, epoch],
    )
    if reply[0] != "ok":
        return _refusal(reply)
    votes: list[Any] = reply[1]
    return votes


async def deadletter(
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
) -> None:
    """deadletter.lua (its reply is always 'ok')."""
    await commands.script(
        SCRIPTS["deadletter"],
        [requests, dead, request, outcome, inbox, audit],
        [entry, reason, group, dead_max, result_ttl, rid, audit_max, fields],
    )


async def decision_revoke(
    commands: Commands,
    *,
    decisions: Key,
    expiry: Key,
    audit: Key,
    decision: Key,
    id: str,
    by: str,
    audit_max: int,
) -> Reply:
    """decision_revoke.lua: 'ok' | 'gone' | 'moved' (``value`` the key the index names)."""
    reply = await commands.script(SCRIPTS["decision_revoke"], [decisions, expiry, audit, decision], [id, by, audit_max])
    return _tagged(reply)


async def audit_append(commands: Commands, *, audit: Key, audit_max: int, head: str, fields: Sequence[Any]) -> Reply:
    """audit_append.lua: 'ok' (``value`` the entry id) | 'moved' (the current head; nothing written)."""
    return _tagged(await commands.script(SCRIPTS["audit_append"], [audit], [audit_max, head, *fields]))


# -- the maintenance worker -------------------------------------------------------------------------------------


async def reap(
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
) -> Reply:
    """reap.lua: 'withdrawn' or 'away' (``value`` why) | 'live' | 'stale' (the state) | 'moved' (the client)."""
    reply = await commands.script(
        SCRIPTS["reap"],
        [request, requests, record, liveness, inbox, outcome, audit, away],
        [rid, entry, group, result_ttl, audit_max, liveness_grace],
    )
    return _tagged(reply)


async def expire(
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
) -> Reply:
    """expire.lua: 'expired' (``value`` a client still to be told, or '') | 'waiting' | 'no-deadline' | 'settled' |
    'gone' | 'keyed' (``value`` the agent id, ``detail`` the key: call again with their durable key)."""
    keys = (
        [request, requests, outcome, inbox, audit]
        if durable is None
        else [request, requests, outcome, inbox, audit, durable]
    )
    return _tagged(await commands.script(SCRIPTS["expire"], keys, [rid, group, result_ttl, audit_max]))


async def away_end(
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
) -> Reply:
    """away_end.lua: 'expired' | 'uncollected' | 'waiting' | 'back' | 'collected' | 'gone'."""
    keys = (
        [request, requests, outcome, away, audit]
        if durable is None
        else [request, requests, outcome, away, audit, durable]
    )
    return _tagged(await commands.script(SCRIPTS["away_end"], keys, [rid, group, audit_max]))


async def standbys_prune(commands: Commands, *, standbys: Key) -> int:
    """standbys_prune.lua: how many registrations it dropped."""
    return int(await commands.script(SCRIPTS["standbys_prune"], [standbys], []))


async def audit_cursor(commands: Commands, *, cursor: Key, read_from: str, to: str) -> bool:
    """audit_cursor.lua: True when advanced (False: another worker moved it first)."""
    return bool(await commands.script(SCRIPTS["audit_cursor"], [cursor], [read_from, to]))


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
