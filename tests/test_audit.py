"""A tamper-evident audit (issue 22 item 5), on a real redis-server.

A real run (a provider answers and remembers, housekeeping expires a deadline, a decision is
revoked) verifies; then each way of tampering with the stream that the answering or maintenance
Redis user allows is shown to land, and ``verify`` names it: an entry deleted, altered or
inserted, the head moved, the whole chain recomputed under a checkpoint signed by a key nobody
trusts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any

import fakeredis
import pytest
from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from broker import Remember
from broker.audit import AuditReport, chain_of, checkpoint, checkpoint_message, verify
from broker.operating.housekeeping import expire_overdue
from broker.signing import SigningKey, TrustedKeys
from tests.helpers import SIGNING_KEY, one_question, pick
from tests.redis_server import FAST_SYNC

pytestmark = pytest.mark.timeout(30)

TRUSTED = TrustedKeys([SIGNING_KEY.public_text])


async def _next(provider: Any) -> Any:
    return await asyncio.wait_for(anext(aiter(provider)), 5)


async def real_run(make_broker: Any, redis: Redis) -> Any:
    """Answers, a remembered decision, an expiry and a revocation; the provider checkpoints as it stops."""
    asking, answering = await make_broker(), await make_broker()
    keys = asking.keys
    async with answering.provider("p1") as provider:
        task = asyncio.create_task(asking.ask(one_question()))
        await (await _next(provider)).answer(pick("yes"), by="alice", remember=Remember())
        assert await asyncio.wait_for(task, 5) == pick("yes")
        overdue = asyncio.create_task(asking.ask(one_question("a", "b")))
        shown = await _next(provider)
        now_s, now_us = await redis.time()
        await redis.hset(keys.request(shown.request_id), "deadline", now_s * 1000 + now_us // 1000 - 1)  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
        assert await expire_overdue(answering) == [shown.request_id]
        with pytest.raises(Exception, match="ASK_TIMED_OUT"):
            await asyncio.wait_for(overdue, 5)
        [decision] = await answering.decisions()
        assert await answering.revoke_decision(decision.id, by="bob")
        task = asyncio.create_task(asking.ask(one_question("c", "d")))
        await (await _next(provider)).cancel(by="carol")
        with pytest.raises(Exception, match="ASK_CANCELLED"):
            await asyncio.wait_for(task, 5)
    return answering


async def entries(redis: Redis, stream: str) -> list[tuple[str, dict[str, str]]]:
    return [(i, dict(f)) for i, f in await redis.xrange(stream)]


async def check(broker: Any, trusted: TrustedKeys = TRUSTED) -> AuditReport:
    return await verify(broker.commands, broker.keys, trusted)


def kinds(report: AuditReport) -> set[tuple[str, str]]:
    return {(f.kind, f.entry) for f in report.findings}


async def rewrite(redis: Redis, stream: str, new: list[tuple[str, dict[str, str]]]) -> None:
    """Replace the stream by ``new`` (explicit ids): what a holder of an answering user can do."""
    await redis.delete(stream)
    for entry_id, fields in new:
        entry: dict[FieldT, EncodableT] = {
            name: value for name, value in fields.items()
        }  # dict is invariant: dict[str, str] is not this
        await redis.xadd(stream, entry, id=entry_id)


def rechained(new: list[tuple[str, dict[str, str]]], prev: str = "") -> list[tuple[str, dict[str, str]]]:
    """``new`` with every prev and chain recomputed, as an attacker without the signing key can (and each
    decision's ``hprev``, its human record's link)."""
    out, hprev = [], ""
    for entry_id, fields in new:
        pairs = [("prev", prev)] + [(k, v) for k, v in fields.items() if k not in ("prev", "chain")]
        pairs = [(k, hprev if k == "hprev" else v) for k, v in pairs]
        chain = chain_of(pairs)
        out.append((entry_id, {**dict(pairs), "chain": chain}))
        prev = f"{entry_id} {chain}"
        hprev = prev if "hprev" in fields else hprev
    return out


async def forge(redis: Redis, keys: Any, forged: list[tuple[str, dict[str, str]]]) -> None:
    """Put ``forged`` in place of the audit, its head, its human record and the record's head: the whole of it."""
    await rewrite(redis, keys.audit, forged)
    await redis.set(keys.audit_head, f"{forged[-1][0]} {forged[-1][1]['chain']}")
    human = [(i, f) for i, f in forged if "hprev" in f]
    await rewrite(redis, keys.audit_human, human)
    await redis.set(keys.audit_human_head, f"{human[-1][0]} {human[-1][1]['chain']}")


async def test_a_real_run_is_chained_sealed_and_verifies(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    events = [f["event"] for _, f in stream]
    for event in ("answered", "remembered", "expired", "forgotten", "cancelled", "checkpoint"):
        assert event in events
    assert all(f["chain"] and next(iter(f)) == "prev" for _, f in stream)
    report = await check(broker)
    assert report.status == "intact", report.findings
    assert report.findings == []
    assert report.entries == len(stream) and not report.trimmed
    assert report.checkpoints == 1  # the audit was empty at start; one at the clean stop
    # The last checkpoint seals the entry before it: nothing is left unsealed.
    assert report.sealed_through == stream[-2][0] and report.unsealed == 0
    assert await redis.get(broker.keys.audit_head) == f"{stream[-1][0]} {stream[-1][1]['chain']}"


async def test_an_idle_provider_writes_no_checkpoint(make_broker, redis):
    broker = await real_run(make_broker, redis)
    before = await redis.xlen(broker.keys.audit)
    head = (await redis.get(broker.keys.audit_head)).split(" ")[0]
    assert (
        await checkpoint(broker.commands, broker.keys, SIGNING_KEY, provider="p", epoch=1, maxlen=100, unless_at=head)
        is None
    )
    assert await redis.xlen(broker.keys.audit) == before


async def test_entries_after_the_last_checkpoint_are_reported_unsealed(make_broker, redis):
    broker = await real_run(make_broker, redis)
    await broker.revoke_decision("nosuch", by="x")  # writes nothing
    async with broker.provider("p2") as provider:
        provider.checkpoint_every = 3600
        task = asyncio.create_task(broker.ask(one_question()))
        await (await _next(provider)).answer(pick("yes"))
        await asyncio.wait_for(task, 5)
        report = await check(broker)
        assert report.status == "intact" and report.unsealed == 1
    assert (await check(broker)).unsealed == 0  # the clean stop sealed it


async def test_a_deleted_entry_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    victim = next(i for i, f in stream if f["event"] == "expired")  # the first would pass for trimmed
    assert await redis.xdel(broker.keys.audit, victim) == 1  # the attack lands
    report = await check(broker)
    assert report.status == "broken"
    assert ("deleted", victim) in kinds(report)


async def test_the_last_entry_deleted_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    last = (await entries(redis, broker.keys.audit))[-1][0]
    await redis.xdel(broker.keys.audit, last)
    assert ("deleted", last) in kinds(await check(broker))


async def test_an_altered_entry_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    victim, fields = next((i, f) for i, f in stream if f["event"] == "cancelled")
    copy = await redis.xadd(broker.keys.audit, {**fields, "by": "mallory"})  # a copy, who cancelled changed
    await redis.xdel(broker.keys.audit, victim)
    report = await check(broker)
    assert report.status == "broken"
    assert {("deleted", victim), ("altered", copy)} <= kinds(report)


async def test_an_entry_altered_in_place_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    index = next(n for n, (_, f) in enumerate(stream) if f["event"] == "answered")
    stream[index][1]["by"] = "mallory"
    await rewrite(redis, broker.keys.audit, stream)
    assert kinds(await check(broker)) == {("altered", stream[index][0])}


async def test_an_altered_and_rechained_entry_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    # not a person's decision: the human record's copy of one would name it too (tests/test_audit_decisions.py)
    index = next(n for n, (_, f) in enumerate(stream) if f["event"] == "expired")
    stream[index][1]["reason"] = "mallory says so"
    stream[index] = rechained([stream[index]], stream[index][1]["prev"])[0]  # its own chain fixed up
    await rewrite(redis, broker.keys.audit, stream)
    assert ("altered", stream[index][0]) in kinds(await check(broker))


async def test_an_inserted_entry_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    # between two entries of different milliseconds, where an id is free
    index = next(n for n in range(1, len(stream)) if stream[n][0].split("-")[0] != stream[n - 1][0].split("-")[0])
    before_id, before = stream[index - 1]
    ms, seq = before_id.split("-")
    forged_id = f"{ms}-{int(seq) + 1}"
    forged = rechained(
        [(forged_id, {"event": "answered", "rid": "r-forged", "by": "alice"})], f"{before_id} {before['chain']}"
    )
    await rewrite(redis, broker.keys.audit, stream[:index] + forged + stream[index:])
    report = await check(broker)
    assert kinds(report) == {("inserted", forged_id)}


async def test_a_forged_entry_appended_past_the_head_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    _, last = (await entries(redis, broker.keys.audit))[-1]
    [(_, fields)] = rechained([("0-0", {"event": "answered", "rid": "r9", "by": "alice"})], f"x-1 {last['chain']}")
    forged = await redis.xadd(broker.keys.audit, fields)
    assert ("inserted", forged) in kinds(await check(broker))


async def test_a_whole_chain_recomputed_under_an_untrusted_checkpoint_is_caught(make_broker, redis):
    broker = await real_run(make_broker, redis)
    keys = broker.keys
    stream = await entries(redis, keys.audit)
    index = next(n for n, (_, f) in enumerate(stream) if f["event"] == "answered")
    stream[index][1]["by"] = "mallory"
    # The attacker drops the genuine checkpoints, recomputes every chain, and seals it with its own key.
    forged = rechained([e for e in stream if e[1]["event"] != "checkpoint"])
    mallory = SigningKey.generate()
    last_id, last = forged[-1]
    seal = {
        "event": "checkpoint",
        "at": last_id,
        "sealed": last["chain"],
        "key": mallory.id,
        "sig": mallory.sign_checkpoint(checkpoint_message(keys.namespace, last_id, last["chain"])),
    }
    ms = int(last_id.split("-")[0])
    forged += rechained([(f"{ms}-999", seal)], f"{last_id} {last['chain']}")
    await forge(redis, keys, forged)
    assert (await check(broker, TrustedKeys([mallory.public_text]))).status == "intact"  # the forgery is whole
    report = await check(broker)
    assert report.status == "broken"
    assert {f.kind for f in report.findings} == {"checkpoint"}
    assert report.checkpoints == 0


async def test_a_rewrite_that_keeps_the_genuine_checkpoints_is_caught(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    index = next(n for n, (_, f) in enumerate(stream) if f["event"] == "answered")
    stream[index][1]["by"] = "mallory"
    forged = rechained(stream)
    await forge(redis, broker.keys, forged)
    report = await check(broker)
    assert report.status == "broken"
    assert {f.kind for f in report.findings} == {"checkpoint"}


async def test_a_trimmed_start_is_normal(make_broker, redis):
    broker = await real_run(make_broker, redis)
    stream = await entries(redis, broker.keys.audit)
    await redis.xtrim(broker.keys.audit, maxlen=len(stream) - 3, approximate=False)
    report = await check(broker)
    assert report.status == "intact", report.findings
    assert report.trimmed and report.first == stream[3][0]


async def test_a_reset_head_restarts_the_chain_and_is_named(make_broker, redis):
    broker = await real_run(make_broker, redis)
    await redis.delete(broker.keys.audit_head)
    async with broker.provider("p2") as provider:
        task = asyncio.create_task(broker.ask(one_question()))
        await (await _next(provider)).answer(pick("yes"))
        await asyncio.wait_for(task, 5)
    report = await check(broker)
    assert report.status == "broken"
    assert "restarted" in {f.kind for f in report.findings}


async def test_the_scripts_head_key_is_the_one_keys_names(make_broker, redis):
    broker = await real_run(make_broker, redis)
    head = await redis.get(broker.keys.audit_head)
    last_id, last = (await entries(redis, broker.keys.audit))[-1]
    assert head == f"{last_id} {last['chain']}"
    # and the chain is what Redis's own SHA-1 made of the fields, each '<length>:<bytes>'
    pairs = list(last.items())[:-1]
    assert (
        last["chain"]
        == hashlib.sha1(b"".join(b"%d:%s" % (len(t.encode()), t.encode()) for kv in pairs for t in kv)).hexdigest()
    )


async def test_under_fakeredis_entries_are_unchained():
    from broker import Broker

    server = fakeredis.FakeServer()
    broker = Broker(
        namespace="fake",
        connect=lambda: fakeredis.FakeAsyncRedis(server=server, decode_responses=True),
        signing_key=SIGNING_KEY,
    )
    async with broker:
        assert await broker.revoke_decision("none", by="x") is False
        await broker.commands.call("HSET", broker.keys.decisions, "d1", broker.keys.prefix + "decision:ns:x")
        await broker.commands.call("HSET", broker.keys.prefix + "decision:ns:x", "id", "d1", "summary", "{}")
        assert await broker.revoke_decision("d1", by="x") is True
        [(_, fields)] = await broker.commands.call("XRANGE", broker.keys.audit, "-", "+")
        assert fields["chain"] == ""
        report = await verify(broker.commands, broker.keys, TRUSTED)
    assert report.status == "unchained" and report.findings == []


async def test_a_provider_seals_while_the_audit_moves_and_not_while_idle(make_broker, redis, monkeypatch):
    from broker import audit

    monkeypatch.setattr(audit, "CHECKPOINT_EVERY", 0.1)
    broker = await make_broker()

    async def checkpoints() -> int:
        return sum(1 for _, f in await entries(redis, broker.keys.audit) if f["event"] == "checkpoint")

    async with broker.provider("p1") as provider:
        task = asyncio.create_task(broker.ask(one_question()))
        await (await _next(provider)).answer(pick("yes"))
        await asyncio.wait_for(task, 5)
        for _ in range(50):
            if await checkpoints():
                break
            await asyncio.sleep(0.05)
        assert await checkpoints() == 1
        await asyncio.sleep(0.5)  # five periods, nothing new: no checkpoint
        assert await checkpoints() == 1
        report = await check(broker)
        assert report.status == "intact" and report.unsealed == 0
    assert await checkpoints() == 1  # the clean stop had nothing new to seal either


def test_no_script_appends_to_the_audit_but_through_the_chain():
    """Every script whose contract names an audit stream key appends to it by audit_append only: a raw XADD
    there is an unchained entry, which `verify` reports as slipped in (approve.lua's votes once were)."""
    import re
    from pathlib import Path

    import broker

    scripts = Path(broker.__file__).parent / "scripts"
    raw = []
    for path in sorted(scripts.glob("*.lua")):
        text = path.read_text()
        header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
        for index in re.findall(r"KEYS\[(\d+)\] audit stream", header):
            if re.search(rf"redis\.call\('XADD', KEYS\[{index}\]", text):
                raw.append(path.name)
    assert raw == []


@pytest.mark.timeout(60)
async def test_a_failover_that_loses_the_last_entries_leaves_a_chain_that_verifies(make_broker, redis_factory):
    """Redis fails over to a replica that missed the last writes (promoted while the old master went on):
    each entry and the head move in the same script, so the replica holds a shorter chain, not a broken
    one; `verify` finds it intact, and answers on the new master chain on from its head."""
    master, replica = redis_factory(*FAST_SYNC), redis_factory()
    follower = Redis(port=replica.port, decode_responses=True)
    leader = Redis(port=master.port, decode_responses=True)
    try:
        await follower.execute_command("REPLICAOF", "127.0.0.1", master.port)
        async with asyncio.timeout(30):  # the first full sync, slow on a loaded machine
            while (await follower.info("replication")).get("master_link_status") != "up":
                await asyncio.sleep(0.05)
        on_master = await make_broker(url=master.url, lease_ttl=2)  # its lease lapses on the promoted replica
        async with on_master.provider("p1") as provider:
            for label in ("yes", "no"):
                task = asyncio.create_task(on_master.ask(one_question("yes", "no")))
                await (await _next(provider)).answer(pick(label), by="alice")
                await asyncio.wait_for(task, 5)
            # WAIT covers its own connection's writes only: one write first puts the broker's under it (the
            # CI flake: a WAIT on a connection that wrote nothing returned at once, the replica a step behind)
            await leader.set("tests:replicated", "1")
            assert await leader.wait(1, 20_000) == 1  # the replica has these
            await follower.execute_command("REPLICAOF", "NO", "ONE")  # promoted; the old master goes on alone
            task = asyncio.create_task(on_master.ask(one_question("yes", "no")))
            await (await _next(provider)).answer(pick("yes"), by="lost")
            await asyncio.wait_for(task, 5)
        keys = on_master.keys
        lost = [f for _, f in await entries(leader, keys.audit) if f.get("by") == "lost"]
        assert lost, "the old master has the entry the replica missed: the fault fired"
        kept = await entries(follower, keys.audit)
        assert all(f.get("by") != "lost" for _, f in kept) and kept
        on_replica = await make_broker(url=replica.url)
        report = await check(on_replica)
        assert report.status == "intact", report.findings
        async with on_replica.provider("p2") as provider:
            task = asyncio.create_task(on_replica.ask(one_question("yes", "no")))
            await (await _next(provider)).answer(pick("no"), by="bob")
            await asyncio.wait_for(task, 5)
        report = await check(on_replica)
        assert report.status == "intact" and report.entries > len(kept), report.findings
    finally:
        await follower.aclose()
        await leader.aclose()


async def test_a_card_of_several_askers_settled_in_one_call_chains_every_entry(make_broker):
    """settle.lua appends an entry per asker of a card in one call; audit_append reads the heads once per call,
    so each entry must still name the one just before it (and the human record likewise): the chain verifies."""
    holder = await make_broker()
    brokers = [await make_broker() for _ in range(3)]
    async with holder.provider("p1") as provider, contextlib.AsyncExitStack() as stack:
        agents = [await stack.enter_async_context(b.agent(f"a{n}")) for n, b in enumerate(brokers)]
        asks = [asyncio.ensure_future(agent.ask(one_question("yes", "no"), timeout=20)) for agent in agents]
        card = await _next(provider)
        async with asyncio.timeout(10):
            while len(card.askers) < 3:
                await asyncio.sleep(0.02)
        await card.answer(pick("yes"), by="alice")
        await asyncio.wait_for(asyncio.gather(*asks), 10)
    report = await check(holder)
    assert report.status == "intact", report.findings
    assert report.human_entries == 3
