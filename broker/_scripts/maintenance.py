"""The bindings of the maintenance worker's scripts: reap, expire, away_end and the prunes."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from .._lua import SCRIPTS
from .reply import Key, Reply, tagged

if TYPE_CHECKING:
    from .._commands import Commands


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
        tagged,
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
    return commands.script(SCRIPTS["expire"], keys, [rid, group, result_ttl, audit_max], tagged)


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
    return commands.script(SCRIPTS["away_end"], keys, [rid, group, audit_max], tagged)


def standbys_prune(commands: Commands, *, standbys: Key) -> Awaitable[int]:
    """standbys_prune.lua: how many registrations it dropped."""
    return commands.script(SCRIPTS["standbys_prune"], [standbys], [], int)


def audit_cursor(commands: Commands, *, cursor: Key, read_from: str, to: str) -> Awaitable[bool]:
    """audit_cursor.lua: True when advanced (False: another worker moved it first)."""
    return commands.script(SCRIPTS["audit_cursor"], [cursor], [read_from, to], bool)
