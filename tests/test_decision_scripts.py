"""The remembered-decision parts of ask.lua, settle.lua and decision_revoke.lua, called directly.

Nothing stands between the test and the script (as in tests/test_script_invariants.py), so
each rule fails here when it is removed from the script: tests/mutants.toml names them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from broker._keys import GROUP
from broker.decisions import question_fingerprint
from broker.types import decode_request
from tests.test_script_invariants import AUDIT_MAX, RESULT_MS, Namespace, holder, outcome, stale_fence

pytestmark = pytest.mark.timeout(20)

REQUEST = {"questions": [{"id": "q1", "question": "yes?", "options": [{"label": "yes"}, {"label": "no"}]}]}
FP = question_fingerprint(decode_request(json.dumps(REQUEST)).questions[0])


@pytest.fixture
async def ns(redis: Redis, namespace: str) -> Namespace:
    scripts = Namespace(redis, namespace)
    await redis.xgroup_create(scripts.keys.requests, GROUP, id="0", mkstream=True)
    return scripts


async def ask(
    ns: Namespace, rid: str, *, remember: str = "1", agent: str = "", qid: str = "q1", lookup: bool = True
) -> list[Any]:
    """ask.lua as the broker calls it, with the decision lookup (no agent record: agentless unless told)."""
    k = ns.keys
    request = dict(REQUEST, questions=[dict(REQUEST["questions"][0], id=qid)])
    found = [k.decision(FP, agent) if agent else k.decision(FP), k.decision(FP)]
    keys = [k.requests, k.request(rid), k.request(rid), k.audit, k.request(rid), k.request(rid), k.outcome(rid)]
    args = [rid, json.dumps(request), "", "", "c1", RESULT_MS, AUDIT_MAX, "", "0", "", "", "", "", "", remember]
    args += [RESULT_MS, k.provider, k.standbys, 1 if lookup else 0, *([qid, *found] if lookup else [])]
    return list(await ns.script("ask", keys, args))


async def settle_remembering(
    ns: Namespace, fence: str, epoch: int, rid: str, *, call: str = "call-1", decision: str = "d1", agent: str = ""
) -> list[Any]:
    k = ns.keys
    keys = [k.provider, k.requests, k.audit, k.decisions, k.decision_expiry]
    keys += [k.request(rid), k.outcome(rid), k.inbox("c1"), k.request(rid), k.decision(FP, agent or None)]
    summary = json.dumps({"scope": "agent" if agent else "namespace", "agent": agent or None, "fingerprint": FP})
    args: list[Any] = [fence, "ui", epoch, GROUP, AUDIT_MAX, RESULT_MS, "0"]
    args += [rid, "answered", outcome("yes"), "alice", call, "claimed", "", ""]
    args += [1, decision, 60_000, '["yes"]', summary, '{"sig":"-"}']
    reply = await ns.script("settle", keys, args)
    return [list(reply)] if reply[0] == "err" else [list(r) for r in reply[1]]


async def remembered(ns: Namespace) -> str:
    """A namespace decision for FP, set by answering r0: its fence and epoch."""
    fence, epoch = await holder(ns)
    assert (await ask(ns, "r0"))[0] == "ok"
    assert (await settle_remembering(ns, fence, epoch, "r0"))[0] == ["ok"]
    return fence


async def test_a_fenced_provider_cannot_set_a_decision(ns: Namespace) -> None:
    fence, epoch = await stale_fence(ns)
    await ask(ns, "r1")
    before = await ns.snapshot()
    assert (await settle_remembering(ns, fence, epoch, "r1"))[0][:2] == ["err", "LEASE_LOST"]
    assert await ns.snapshot() == before
    assert not await ns.redis.exists(ns.keys.decision(FP))


async def test_the_holder_sets_a_decision_with_its_index_and_audit(ns: Namespace) -> None:
    await remembered(ns)
    record = await ns.redis.hgetall(ns.keys.decision(FP))  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
    assert (record["id"], record["selected"], record["by"], record["provider"]) == ("d1", '["yes"]', "alice", "ui")
    assert int(record["expires"]) - int(record["at"]) == 60_000
    assert 0 < await ns.redis.pttl(ns.keys.decision(FP)) <= 60_000
    assert await ns.redis.hgetall(ns.keys.decisions) == {"d1": ns.keys.decision(FP)}  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
    assert await ns.redis.zscore(ns.keys.decision_expiry, "d1") == float(record["expires"])
    [event] = await ns.audit("remembered")
    assert (event["decision"], event["rid"], event["by"]) == ("d1", "r0", "alice")


async def test_remembering_again_replaces_the_old_decision_and_prunes_expired_ones(ns: Namespace) -> None:
    fence = await remembered(ns)
    epoch = int(fence.split(":")[0])
    await ask(ns, "r1", lookup=False)  # asked as if before the decision existed
    assert (await settle_remembering(ns, fence, epoch, "r1", call="c1", decision="d2"))[0] == ["ok"]
    assert await ns.redis.hgetall(ns.keys.decisions) == {"d2": ns.keys.decision(FP)}  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]; d1 replaced
    assert await ns.redis.zrange(ns.keys.decision_expiry, 0, -1) == ["d2"]
    # d2 lapses (its key expired, its score passed); the next decision set prunes it from the index
    await ns.redis.delete(ns.keys.decision(FP))
    await ns.redis.zadd(ns.keys.decision_expiry, {"d2": 1})
    await ask(ns, "r2", agent="builder", lookup=False)
    assert (await settle_remembering(ns, fence, epoch, "r2", call="c2", decision="d3", agent="builder"))[0] == ["ok"]
    assert await ns.redis.hgetall(ns.keys.decisions) == {"d3": ns.keys.decision(FP, "builder")}  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
    assert await ns.redis.zrange(ns.keys.decision_expiry, 0, -1) == ["d3"]
    assert 0 < await ns.redis.pttl(ns.keys.decisions) <= 60_000


async def test_a_decided_ask_is_settled_in_the_script_with_the_new_ids(ns: Namespace) -> None:
    await remembered(ns)
    before = await ns.stream_ids()
    reply = await ask(ns, "r1", qid="deploy-2")
    assert reply[:2] == ["decided", '{"answer":{"answers":[{"id":"deploy-2","selected":["yes"]}]}}']
    assert reply[3] == ["d1", '["yes"]', '{"sig":"-"}']  # per question: what the asker verifies
    assert await ns.stream_ids() == before  # nothing enqueued
    state = await ns.redis.hgetall(ns.keys.request("r1"))  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
    assert (state["state"], state["by"]) == ("answered", "decision:d1")
    assert await ns.redis.get(ns.keys.outcome("r1")) == reply[1]
    [event] = [e for e in await ns.audit("answered") if e["rid"] == "r1"]
    assert (event["by"], event["decided_by"]) == ("decision:d1", "alice via ui")
    # a retry after a lost reply enqueues nothing; the outcome key (which the asker's sweep reads) is there
    assert (await ask(ns, "r1", qid="deploy-2"))[0] == "ok"
    assert await ns.stream_ids() == before


async def test_a_decided_ask_needs_no_provider(ns: Namespace) -> None:
    await remembered(ns)
    await ns.redis.delete(ns.keys.provider, ns.keys.standbys)
    assert (await ask(ns, "r1"))[0] == "decided"
    assert (await ask(ns, "r2", remember="0"))[:2] == ["err", "NO_PROVIDER"]


async def test_an_opted_out_ask_reaches_the_provider_and_its_answer_is_not_remembered(ns: Namespace) -> None:
    fence = await remembered(ns)
    epoch = int(fence.split(":")[0])
    reply = await ask(ns, "r1", remember="0")
    assert reply[0] == "ok"
    [(_, fields)] = [e for e in await ns.redis.xrange(ns.keys.requests) if e[0] == reply[1]]
    assert fields["remember"] == "0"
    await ns.redis.delete(ns.keys.decision(FP))
    refused = (await settle_remembering(ns, fence, epoch, "r1", decision="d9"))[0]
    assert refused[:2] == ["err", "BAD_ANSWER"]
    assert await ns.redis.hget(ns.keys.request("r1"), "state") == "pending"  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
    assert not await ns.redis.exists(ns.keys.decision(FP))


async def test_an_agent_decision_answers_that_agent_only(ns: Namespace) -> None:
    fence, epoch = await holder(ns)
    await ask(ns, "r0", agent="builder")
    assert (await settle_remembering(ns, fence, epoch, "r0", agent="builder"))[0] == ["ok"]
    assert (await ask(ns, "r1", agent="builder"))[0] == "decided"
    assert (await ask(ns, "r2", agent="other"))[0] == "ok"
    assert (await ask(ns, "r3"))[0] == "ok"


async def test_a_namespace_decision_answers_an_agents_ask(ns: Namespace) -> None:
    """The lookup reads the agent's decision key, then the namespace's: no agent decision is no answer yet."""
    await remembered(ns)
    reply = await ask(ns, "r1", agent="builder")
    assert reply[0] == "decided" and reply[3][0] == "d1"


async def test_revoke_forgets_the_decision_once_and_audits_who(ns: Namespace) -> None:
    await remembered(ns)
    k = ns.keys
    keys = [k.decisions, k.decision_expiry, k.audit, k.decision(FP)]
    assert list(await ns.script("decision_revoke", keys, ["d1", "bob", AUDIT_MAX])) == ["ok"]
    assert list(await ns.script("decision_revoke", keys, ["d1", "bob", AUDIT_MAX])) == ["gone"]
    assert not await ns.redis.exists(k.decision(FP))
    assert await ns.redis.hlen(k.decisions) == 0 and await ns.redis.zcard(k.decision_expiry) == 0  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
    [event] = await ns.audit("forgotten")
    assert (event["decision"], event["by"]) == ("d1", "bob")
    assert (await ask(ns, "r1"))[0] == "ok"


async def test_a_request_whose_second_question_has_no_decision_is_enqueued_not_decided(ns: Namespace) -> None:
    """ask.lua answers from decisions only when every question has one (the asker would refuse a partial
    answer too, which would hide the script's mistake end to end: so this calls the script alone)."""
    await remembered(ns)  # a decision for FP (question "yes?")
    await holder(ns)  # a provider, so that the enqueue is not NO_PROVIDER
    k = ns.keys
    other = {"id": "q2", "question": "and this?", "options": [{"label": "a"}]}
    request = dict(REQUEST, questions=[REQUEST["questions"][0], other])
    fp_other = question_fingerprint(decode_request(json.dumps({"questions": [other]})).questions[0])
    found = [k.decision(FP), k.decision(FP), k.decision(fp_other), k.decision(fp_other)]
    keys = [k.requests, k.request("r9"), k.request("r9"), k.asklog, k.request("r9"), k.request("r9"), k.outcome("r9")]
    args = ["r9", json.dumps(request), "", "", "c1", RESULT_MS, AUDIT_MAX, "", "0", "", "", "", "", "", "1"]
    args += [RESULT_MS, k.provider, k.standbys, 2, "q1", "q2", *found]
    reply = list(await ns.script("ask", keys, args))
    assert reply[0] == "ok", reply
    assert not await ns.redis.exists(k.outcome("r9"))
