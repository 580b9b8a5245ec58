"""The housekeeping scripts (reap, expire, standbys_prune, audit_cursor) called directly, one invariant each.

As in test_script_invariants.py, nothing stands between the test and the script, and
tests/mutants.toml names the mutation of each script that each test catches.
"""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from broker._keys import GROUP
from broker._lua import Script
from tests.test_script_invariants import (
    RESULT_MS,
    Namespace,
    after_a_redis_start,
    delivered_request,
    holder,
    ns,
    outcome,
    redis_ms,
)

__all__ = ["ns"]  # the fixture the tests use

pytestmark = pytest.mark.timeout(20)

AUDIT_MAX = 1000
SCRIPTS = {name: Script(name) for name in ("reap", "expire", "standbys_prune", "audit_cursor")}


async def run(redis: Redis, name: str, keys: list[str], args: list[Any]) -> Any:
    script = SCRIPTS[name]
    await redis.script_load(script.source)
    return await redis.evalsha(script.sha, len(keys), *keys, *args)  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]


async def reap(ns: Namespace, rid: str, entry: str, client: str = "c1", *, grace_ms: int = 0) -> list[str]:
    k = ns.keys
    keys = [
        k.request(rid),
        k.requests,
        k.request(rid),
        k.client(client),
        k.inbox(client),
        k.outcome(rid),
        k.audit,
        k.away,
    ]
    return list(await run(ns.redis, "reap", keys, [rid, entry, GROUP, RESULT_MS, AUDIT_MAX, grace_ms]))


async def expire(ns: Namespace, rid: str, client: str = "c1") -> list[Any]:
    k = ns.keys
    keys = [k.request(rid), k.requests, k.outcome(rid), k.inbox(client), k.audit]
    return list(await run(ns.redis, "expire", keys, [rid, GROUP, RESULT_MS, AUDIT_MAX]))


async def pending_request(ns: Namespace, rid: str = "r1") -> str:
    """An ask enqueued (not yet read by a provider); its entry id."""
    await holder(ns)
    await ns.asker_alive()
    reply = await ns.ask(rid)
    assert reply[0] == "ok", reply
    return str(reply[1])


async def test_reap_leaves_a_request_whose_asker_is_alive(ns):
    _, _, entry = await delivered_request(ns)  # the asker's liveness key is set
    before = await ns.snapshot()
    assert await reap(ns, "r1", entry) == ["live"]
    assert await ns.snapshot() == before


@after_a_redis_start(kept="live", dropped="withdrawn")
async def test_reap_gives_askers_time_to_beat_again_after_a_redis_start(ns, created, grace_ms, reply):
    """A restart that outlasted the TTLs dropped live askers' keys with the dead ones' (issue 26 item 4)."""
    _, _, entry = await delivered_request(ns)
    await ns.redis.delete(ns.keys.client("c1"))  # gone, as such a restart drops it
    if created is not None:
        await ns.redis.hset(ns.keys.request("r1"), "created", created)  # asked before this server started
    assert (await reap(ns, "r1", entry, grace_ms=grace_ms))[0] == reply  # a grace longer than the uptime


async def test_reap_withdraws_a_request_whose_asking_process_stopped(ns):
    _, _, entry = await delivered_request(ns)
    await ns.redis.delete(ns.keys.client("c1"))
    assert (await reap(ns, "r1", entry))[0] == "withdrawn"
    assert await ns.redis.hget(ns.keys.request("r1"), "state") == "withdrawn"
    assert await ns.redis.lrange(ns.keys.inbox("c1"), 0, -1) == ["r1"]  # a paused asker that wakes is told


async def test_reap_of_an_answered_request_only_removes_the_stale_entry(ns):
    fence, epoch, _ = await delivered_request(ns)
    await ns.settle(fence, epoch, "r1", outcome("yes"), call="call-1")
    await ns.redis.delete(ns.keys.client("c1"))  # the asker is gone too: still not to be withdrawn
    stale = await ns.redis.xadd(ns.keys.requests, {"kind": "ask", "rid": "r1", "client": "c1", "agent": ""})
    assert await reap(ns, "r1", stale) == ["stale", "answered"]
    assert await ns.redis.hget(ns.keys.request("r1"), "state") == "answered"
    assert await ns.redis.get(ns.keys.outcome("r1")) == outcome("yes")
    assert await ns.stream_ids() == []


async def test_expire_waits_for_a_deadline_still_ahead(ns):
    await pending_request(ns)
    await ns.redis.hset(ns.keys.request("r1"), "deadline", await redis_ms(ns.redis) + 60_000)
    before = await ns.snapshot()
    reply = await expire(ns, "r1")
    assert reply[0] == "waiting" and 0 < int(reply[1]) <= 60_000
    assert await ns.snapshot() == before


async def test_expire_settles_a_request_past_its_deadline_with_ask_timed_out(ns):
    await pending_request(ns)
    await ns.redis.hset(ns.keys.request("r1"), "deadline", await redis_ms(ns.redis) - 1)
    assert await expire(ns, "r1") == ["expired"]
    assert await ns.redis.hget(ns.keys.request("r1"), "state") == "expired"
    assert "ASK_TIMED_OUT" in await ns.redis.get(ns.keys.outcome("r1"))


async def test_expire_leaves_a_settled_request_alone(ns):
    fence, epoch, _ = await delivered_request(ns)
    await ns.settle(fence, epoch, "r1", outcome("yes"), call="call-1")
    await ns.redis.hset(ns.keys.request("r1"), "deadline", await redis_ms(ns.redis) - 1)
    before = await ns.snapshot()
    assert await expire(ns, "r1") == ["settled", "answered"]
    assert await ns.snapshot() == before


async def test_standbys_prune_drops_only_expired_registrations(ns):
    now = await redis_ms(ns.redis)
    await ns.redis.zadd(ns.keys.standbys, {"old:ui": now - 1000, "live:ui": now + 60_000})
    assert await run(ns.redis, "standbys_prune", [ns.keys.standbys], []) == 1
    assert await ns.redis.zrange(ns.keys.standbys, 0, -1) == ["live:ui"]


async def test_audit_cursor_advances_only_from_where_it_was_read(ns):
    key = ns.keys.prefix + "audit-cursor"
    assert await run(ns.redis, "audit_cursor", [key], ["", "1-0"]) == 1
    assert await run(ns.redis, "audit_cursor", [key], ["", "2-0"]) == 0  # another worker moved it first
    assert await ns.redis.get(key) == "1-0"
    assert await run(ns.redis, "audit_cursor", [key], ["1-0", "2-0"]) == 1
