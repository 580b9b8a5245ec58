"""A person's decision outlives what askers write (invariant 15), on a real redis-server with one user per role.

Seen with real processes: the asker's user wrote ~10 300 asks of a process that does not exist, the
provider audited a ``withdrawn`` entry for each, the audit's cap trimmed alice's answer, and
``qbroker audit verify`` said INTACT. Here the same flood, past a small cap: the answer's entry is still
in the audit (its human record, ``qb:{NS}:audit:human``), and ``verify`` (the engine and the real
command) finds the audit intact; then each way the answering or maintenance user could make a decision
leave the record is reported.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Remember
from broker._lua import SCRIPTS
from broker.audit import HUMAN_EVENTS, AuditReport, chain_of, verify
from broker.operating.housekeeping import trim_audit
from broker.signing import TrustedKeys
from tests.helpers import SIGNING_KEY, next_pending, one_question, pick
from tests.redis_server import RedisServer
from tests.test_audit import real_run, rechained
from tests.test_roles import NS, P, client, roles_server, url
from tests.workers.procs import Worker, run_qbroker

__all__ = ["roles_server"]

pytestmark = pytest.mark.timeout(40)

CAP = 50
"""the audit's cap in these tests (10 000 by default)"""
TRUSTED = TrustedKeys([SIGNING_KEY.public_text])
HUMAN = P + "audit:human"


async def flood(server: RedisServer, count: int) -> None:
    """``count`` asks of processes that do not exist, written with the asker's own user: each one the provider
    withdraws, auditing a ``withdrawn`` entry."""
    asker = client(server, "asker")
    try:
        seconds, micros = await asker.time()
        now = seconds * 1000 + micros // 1000
        request = json.dumps({"questions": [{"id": "q1", "question": "flood?", "options": [{"label": "x"}]}]})
        pipe = asker.pipeline(transaction=False)
        for i in range(count):
            rid, ghost = f"ghost-{i}", f"gone-{i}"
            pipe.hset(
                P + f"req:{rid}",
                mapping={"state": "pending", "request": request, "agent": "", "client": ghost, "created": now},
            )
            pipe.xadd(P + "requests", {"kind": "ask", "rid": rid, "client": ghost, "agent": "", "request": request})
        await pipe.execute()
    finally:
        await asker.aclose()


async def drained(redis: Redis) -> None:
    async with asyncio.timeout(20):
        while await redis.xlen(P + "requests"):
            await asyncio.sleep(0.05)


async def answered_and_flooded(roles_server: RedisServer, make_broker: Any) -> tuple[Any, str]:
    """alice answers (and remembers it), bob cancels; then an asker's flood of more than the cap: the
    maintenance broker, and alice's answer's request id."""
    answering = await make_broker(url=url(roles_server, "answerer"), namespace=NS, audit_maxlen=CAP)
    asker = await make_broker(
        url=url(roles_server, "asker"), namespace=NS, signing_key=None, trusted_keys=[SIGNING_KEY.public_text]
    )
    maintenance = await make_broker(url=url(roles_server, "maintenance"), namespace=NS, audit_maxlen=CAP)
    watcher = client(roles_server, "answerer")
    try:
        async with answering.provider("ui") as provider:
            task = asyncio.create_task(asker.ask(one_question(), timeout=10))
            shown = await next_pending(provider)
            await shown.answer(pick("yes"), by="alice", remember=Remember())
            assert await task == pick("yes")
            declined = asyncio.create_task(asker.ask(one_question("a", "b"), timeout=10))
            await (await next_pending(provider)).cancel(by="bob")
            with pytest.raises(Exception, match="ASK_CANCELLED"):
                await declined
            await flood(roles_server, 4 * CAP)
            await drained(watcher)
        await trim_audit(maintenance)  # the maintenance worker's exact cap
        main = [f for _, f in await watcher.xrange(P + "audit")]
        assert all(f.get("rid") != shown.request_id for f in main), "the flood pushed alice's answer out"
        assert sum(f["event"] == "withdrawn" for f in main) >= CAP - 2
    finally:
        await watcher.aclose()
    return maintenance, shown.request_id


async def test_an_askers_flood_past_the_cap_leaves_a_persons_answer_in_the_audit(roles_server, make_broker) -> None:
    maintenance, rid = await answered_and_flooded(roles_server, make_broker)
    redis = client(roles_server, "maintenance")
    try:
        audit = [f for _, f in await redis.xrange(P + "audit")] + [f for _, f in await redis.xrange(HUMAN)]
    finally:
        await redis.aclose()
    kept = [f for f in audit if f.get("rid") == rid and f["event"] in ("answered", "remembered")]
    report = await verify(maintenance.commands, maintenance.keys, TRUSTED)
    # The contract: the answer's record outlives the flood, or verify says that a person's decision left.
    assert kept or report.status != "intact", "alice's answer left the audit and verify says INTACT"
    assert {f["event"] for f in kept} == {"answered", "remembered"} and kept[0]["by"] == "alice"
    assert report.status == "intact", report.findings
    assert report.human_entries >= 3 and report.human_kept >= 3  # the answer, its decision, bob's cancel
    status, out, err = await run_qbroker(
        "audit", "verify", "--json", url=url(roles_server, "maintenance"), namespace=NS
    )
    assert status == 0, err
    assert json.loads(out)["humanKept"] >= 3
    status, out, err = await run_qbroker("audit", "verify", url=url(roles_server, "maintenance"), namespace=NS)
    assert status == 0 and "INTACT" in out.decode(), err
    assert re.search(r"\d+ decision\(s\) of people in the human record, from \S+ \([3-9] from before", out.decode())
    redis = client(roles_server, "maintenance")
    try:
        record = [f for _, f in await redis.xrange(HUMAN)]
    finally:
        await redis.aclose()
    assert {f["event"] for f in record} <= HUMAN_EVENTS  # the flood's entries never entered it


async def test_a_decision_deleted_from_the_record_after_the_flood_is_named(roles_server, make_broker) -> None:
    maintenance, rid = await answered_and_flooded(roles_server, make_broker)
    redis = client(roles_server, "maintenance")
    try:
        [victim] = [i for i, f in await redis.xrange(HUMAN) if f.get("rid") == rid and f["event"] == "answered"]
        assert await redis.xdel(HUMAN, victim) == 1  # the maintenance user's attack lands
    finally:
        await redis.aclose()
    report = await verify(maintenance.commands, maintenance.keys, TRUSTED)
    assert report.status == "broken"
    assert ("deleted", victim) in kinds(report)


def kinds(report: AuditReport) -> set[tuple[str, str]]:
    return {(f.kind, f.entry) for f in report.findings}


async def record_of(redis: Redis, keys: Any) -> list[tuple[str, dict[str, str]]]:
    return [(i, dict(f)) for i, f in await redis.xrange(keys.audit_human)]


async def test_every_decision_of_a_real_run_is_in_the_record_chained(make_broker, redis) -> None:
    broker = await real_run(make_broker, redis)
    audit = [(i, f) for i, f in await redis.xrange(broker.keys.audit) if f["event"] in HUMAN_EVENTS]
    record = await record_of(redis, broker.keys)
    assert [e for e, _ in audit] == [e for e, _ in record] and [dict(f) for _, f in audit] == [f for _, f in record]
    assert {f["event"] for _, f in record} == {"answered", "remembered", "forgotten", "cancelled"}
    assert [f["hprev"] for _, f in record] == [""] + [f"{i} {f['chain']}" for i, f in record[:-1]]
    assert await redis.get(broker.keys.audit_human_head) == f"{record[-1][0]} {record[-1][1]['chain']}"
    report = await verify(broker.commands, broker.keys, TRUSTED)
    assert report.status == "intact" and report.human_entries == len(record) and report.human_kept == 0


async def test_the_record_deleted_whole_is_named(make_broker, redis) -> None:
    broker = await real_run(make_broker, redis)
    record = await record_of(redis, broker.keys)
    assert await redis.delete(broker.keys.audit_human, broker.keys.audit_human_head) == 2
    report = await verify(broker.commands, broker.keys, TRUSTED)
    assert report.status == "broken"
    assert {("deleted", i) for i, _ in record} <= kinds(report)


async def test_a_decision_altered_in_place_in_the_record_is_named(make_broker, redis) -> None:
    broker = await real_run(make_broker, redis)
    keys = broker.keys
    record = await record_of(redis, keys)
    index = next(n for n, (_, f) in enumerate(record) if f["event"] == "answered")
    record[index][1]["by"] = "mallory"  # its chain left as it was
    await redis.delete(keys.audit_human)
    for entry_id, fields in record:
        await redis.xadd(keys.audit_human, fields, id=entry_id)
    report = await verify(broker.commands, broker.keys, TRUSTED)
    assert kinds(report) == {("altered", record[index][0])}


async def test_a_record_rewritten_on_its_own_is_caught_by_the_audit(make_broker, redis) -> None:
    """The oldest decision changed in the record, and the record's own chain recomputed after it: the
    decisions the audit still holds differ from their copies."""
    broker = await real_run(make_broker, redis)
    keys = broker.keys
    record = await record_of(redis, keys)
    stream = [i for i, _ in await redis.xrange(keys.audit)]
    # the first decision is kept by the record only
    await redis.xtrim(keys.audit, minid=record[1][0], approximate=False)
    record[0][1]["by"] = "mallory"
    hprev = ""
    for entry_id, fields in record:
        fields["hprev"] = hprev
        fields["chain"] = chain_of([(k, v) for k, v in fields.items() if k != "chain"])
        hprev = f"{entry_id} {fields['chain']}"
    await redis.delete(keys.audit_human)
    for entry_id, fields in record:
        await redis.xadd(keys.audit_human, fields, id=entry_id)
    await redis.set(keys.audit_human_head, hprev)
    report = await verify(broker.commands, broker.keys, TRUSTED)
    assert report.status == "broken" and len(stream) > 2
    assert ("altered", record[1][0]) in kinds(report)
    assert report.human_kept == 1


async def test_a_decision_cut_from_the_audits_end_is_named_by_its_record(make_broker, redis) -> None:
    """The last decision and what followed it deleted from the audit, its head moved back: the audit alone
    looks whole, its record still holds the decision."""
    broker = await real_run(make_broker, redis)
    keys = broker.keys
    stream = [(i, dict(f)) for i, f in await redis.xrange(keys.audit)]
    cut = max(n for n, (_, f) in enumerate(stream) if f["event"] in HUMAN_EVENTS)
    victim = stream[cut][0]
    for entry_id, _ in stream[cut:]:
        await redis.xdel(keys.audit, entry_id)
    before_id, before = stream[cut - 1]
    await redis.set(keys.audit_head, f"{before_id} {before['chain']}")
    report = await verify(broker.commands, broker.keys, TRUSTED)
    assert report.status == "broken"
    assert ("deleted", victim) in kinds(report)
    assert all(f.entry == victim for f in report.findings)  # the audit alone was whole


async def test_decisions_audited_before_the_record_began_verify(make_broker, redis) -> None:
    """An audit written by the version before the record (no hprev, no record) is intact: an upgrade."""
    broker = await real_run(make_broker, redis)
    keys = broker.keys
    stream = [(i, {k: v for k, v in f.items() if k != "hprev"}) for i, f in await redis.xrange(keys.audit)]
    older = rechained([e for e in stream if e[1]["event"] != "checkpoint"])
    await redis.delete(keys.audit, keys.audit_human, keys.audit_human_head)
    for entry_id, fields in older:
        await redis.xadd(keys.audit, fields, id=entry_id)
    await redis.set(keys.audit_head, f"{older[-1][0]} {older[-1][1]['chain']}")
    report = await verify(broker.commands, broker.keys, TRUSTED)
    assert report.status == "intact", report.findings
    assert report.human_entries == 0


async def test_the_record_is_capped_and_its_trimmed_start_verifies(make_broker, redis) -> None:
    """Invariant 7: each decision's append caps the record (approximately: whole stream nodes, so at least the cap
    is left), and a record trimmed so verifies intact."""
    broker = await make_broker(audit_maxlen=5)
    for i in range(250):
        fields = ["event", "answered", "rid", f"r{i}", "by", "alice"]
        await broker.commands.script(SCRIPTS["audit_append"], [broker.keys.audit], [5, "", *fields])
    left = await redis.xlen(broker.keys.audit_human)
    assert 5 <= left < 250
    report = await verify(broker.commands, broker.keys, TRUSTED)
    assert report.status == "intact", report.findings
    assert report.human_entries == left


def test_the_scripts_and_verify_agree_on_what_a_decision_is() -> None:
    from pathlib import Path

    import broker

    helper = (Path(broker.__file__).parent / "scripts" / "_audit.lua").read_text()
    [table] = re.findall(r"local audit_human_events = \{([^}]*)\}", helper)
    assert set(re.findall(r"(\w+) = true", table)) == HUMAN_EVENTS


@pytest.mark.timeout(60)
async def test_an_automatic_providers_settlements_stay_out_of_the_record(roles_server, make_broker, tmp_path) -> None:
    """`qbroker auto` cancels what askers send it in whatever volume they choose: its settlements must not take the
    record's cap from people's decisions. A person's provider taking the lease after it is recorded again."""
    answering = await make_broker(url=url(roles_server, "answerer"), namespace=NS)
    asker = await make_broker(
        url=url(roles_server, "asker"), namespace=NS, signing_key=None, trusted_keys=[SIGNING_KEY.public_text]
    )

    async def answered_by(person: str) -> None:
        async with answering.provider("ui") as provider:
            task = asyncio.create_task(asker.ask(one_question(), timeout=10))
            await (await next_pending(provider)).answer(pick("yes"), by=person)
            assert await task == pick("yes")

    await answered_by("alice")
    rules = tmp_path / "rules.toml"
    rules.write_text('[default]\ncancel = "ask a human"\n')
    auto = await Worker.start("auto", "--rules", str(rules), url=url(roles_server, "answerer"), namespace=NS)
    try:
        await auto.expect("holding the lease")
        asks = [asker.ask(one_question(f"a{i}", "b"), timeout=10) for i in range(6)]
        outcomes = await asyncio.gather(*asks, return_exceptions=True)
        assert all(getattr(o, "code", None) == "ASK_CANCELLED" for o in outcomes), outcomes
    finally:
        await auto.stop()
    await answered_by("bob")
    redis = client(roles_server, "maintenance")
    try:
        audit = [f for _, f in await redis.xrange(P + "audit")]
        record = [f for _, f in await redis.xrange(HUMAN)]
    finally:
        await redis.aclose()
    assert sum(f["event"] == "cancelled" for f in audit) == 6  # the automatic settlements are audited
    assert [(f["event"], f["by"]) for f in record] == [("answered", "alice"), ("answered", "bob")]
    report = await verify(answering.commands, answering.keys, TRUSTED)
    assert report.status == "intact", report.findings
