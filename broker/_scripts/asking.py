"""The bindings of the asking side's scripts: ask, withdraw, detach, the cleanups, the agent's registration."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from .._lua import SCRIPTS
from .reply import Key, Refusal, Reply, is_one, refused, tagged

if TYPE_CHECKING:
    from .._commands import Commands


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
        return refused(reply)
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
        SCRIPTS["withdraw"], [request, requests, asklog], [rid, state, reason, group, log_max], tagged
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
        SCRIPTS["detach"], [request, requests, away, asklog], [rid, client, log_max, result_ttl], tagged
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
    return int(reply[1]) if reply[0] == "ok" else refused(reply)


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
        SCRIPTS["agent_heartbeat"], [record, agents], [fingerprint, ttl, agent, registered, owner], is_one
    )
