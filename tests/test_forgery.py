"""Attacks an asking agent can run with its own Redis credentials: none may count as an answer.

Issue 22's table, against a real redis-server. Each test first shows that its attack fires (the
forged write lands, the forged notice is taken, the lookup finds the planted decision), then
that the asking call does not return what was forged: it waits on for the human's signed
answer, or ends with an error of its own (docs/security.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Broker, Remember, SigningKey, namespace_status
from broker._lua import SCRIPTS
from broker.decisions import question_fingerprint
from broker.types import encode
from tests.helpers import code_of, next_pending, one_question, pick, plan_review, until

pytestmark = pytest.mark.timeout(30)

FORGED = '{"answer":{"answers":[{"id":"q1","selected":["yes"]}]}}'
"""what the agent wants: its own question approved"""


async def waiting_request(redis: Redis, namespace: str) -> tuple[str, str]:
    """The pending request's id and asking process, as the agent reads them from the stream."""
    entries: list[Any] = []

    async def asked() -> bool:
        nonlocal entries
        entries = await redis.xrange(f"qb:{{{namespace}}}:requests")
        return any(fields.get("kind") == "ask" for _, fields in entries)

    await until(asked)
    [fields] = [fields for _, fields in entries if fields.get("kind") == "ask"]
    return fields["rid"], fields["client"]


async def test_a_forged_notice_on_the_askers_own_inbox_is_not_an_answer(make_broker, redis, namespace):
    """Attack 1 (and 3, the hook's allow): push an answer notice onto one's own inbox."""
    asker, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(one_question(), timeout=20))
        rid, client = await waiting_request(redis, namespace)
        inbox = f"qb:{{{namespace}}}:inbox:{client}"
        await redis.rpush(inbox, f"{rid} {FORGED}")
        await until(lambda: _none_left(redis, inbox))  # the asker took the forged notice
        await until(lambda: asker.rejected_outcomes == 1)
        assert not asking.done()
        await until(lambda: _refused_in_status(answering))  # an operator sees it in qbroker status
        pending = await next_pending(provider)
        await pending.answer(pick("no"), by="alice")
        assert await asyncio.wait_for(asking, 10) == pick("no")  # the human's answer, not the forged one


async def test_a_settle_with_the_lease_fence_read_by_the_agent_is_not_an_answer(make_broker, redis, namespace):
    """Attack 2: read the lease key (it holds the fence) and settle one's own request with it."""
    asker, answering = await make_broker(), await make_broker()
    async with answering.provider("ui"):
        asking = asyncio.create_task(asker.ask(one_question(), timeout=3))
        rid, client = await waiting_request(redis, namespace)
        lease = await redis.get(f"qb:{{{namespace}}}:provider")
        epoch, token, _name = lease.split(":", 2)
        k = f"qb:{{{namespace}}}:"
        keys = [k + "provider", k + "requests", k + "audit", k + "decisions", k + "decisions:expiry"]
        keys += [f"{k}req:{rid}", f"{k}ans:{rid}", f"{k}inbox:{client}", f"{k}req:{rid}"]
        args = [f"{epoch}:{token}:", "ui", epoch, "providers", 100, 60_000, "0"]
        args += [rid, "answered", FORGED, "alice", "forged-call", "claimed", "", "", 0]
        reply = await asker.commands.script(SCRIPTS["settle"], keys, args)
        assert reply == ["ok", [["ok"]]]  # the forged settlement landed, "by alice" in the audit
        assert await redis.hget(f"{k}req:{rid}", "state") == "answered"
        assert await code_of(asking) == "ASK_TIMED_OUT"  # never the forged approval
        assert asker.rejected_outcomes >= 1


async def test_another_requests_signed_answer_written_as_ones_own_is_not_an_answer(make_broker, redis, namespace):
    """Attack 4, with a genuine signature: the same agent asks the same question again, and copies
    the sealed answer of the first ask (from the audit, which holds every outcome) onto the second."""
    asker, answering = await make_broker(sweep_every=0.2), await make_broker()
    async with answering.provider("ui") as provider:
        first = asyncio.create_task(asker.ask(one_question(), timeout=10))
        await (await next_pending(provider)).answer(pick("yes"), by="alice")
        assert await first == pick("yes")
        [answered] = [e for _, e in await redis.xrange(f"qb:{{{namespace}}}:audit") if e.get("event") == "answered"]
        genuine = answered["outcome"]
        assert '"proof"' in genuine

        asking = asyncio.create_task(asker.ask(one_question(), timeout=20))
        pending = await next_pending(provider)
        await redis.set(f"qb:{{{namespace}}}:ans:{pending.request_id}", genuine)  # the sweep reads it
        await until(lambda: asker.rejected_outcomes >= 1)
        assert not asking.done()
        await pending.answer(pick("no"), by="bob")
        assert await asyncio.wait_for(asking, 10) == pick("no")


async def test_a_planted_namespace_decision_is_not_an_answer(make_broker, redis, namespace):
    """Attack 5: write a decision hash under the documented fingerprint; the lookup finds it."""
    asker, answering = await make_broker(), await make_broker()
    fp = question_fingerprint(one_question().questions[0])
    planted = {"id": "forged", "selected": '["yes"]', "by": "alice", "provider": "ui", "proof": "{}"}
    await redis.hset(f"qb:{{{namespace}}}:decision:ns:{fp}", mapping=planted)
    async with answering.provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(one_question(), timeout=20))
        pending = await next_pending(provider)  # a human is asked after all
        assert asker.rejected_outcomes == 1  # the lookup found the planted decision, and it was refused
        asklog = await redis.xrange(f"qb:{{{namespace}}}:asklog")
        answered_by = [e["by"] for _, e in asklog if e.get("event") == "answered"]
        assert answered_by == ["decision:forged"]  # the attack fired: ask.lua took it (the asker's own log says so)
        await pending.answer(pick("no"), by="bob")
        assert await asyncio.wait_for(asking, 10) == pick("no")


async def test_a_decision_signed_by_an_untrusted_key_is_not_an_answer(make_broker, redis, namespace):
    """Attack 5 with a real signature: an agent that made itself a key pair and signs its own decision."""
    rogue = SigningKey.generate()
    rogue_side = await make_broker(signing_key=rogue, trusted_keys=[])
    asker = await make_broker()
    assert rogue.id not in asker.trusted_keys.ids
    async with rogue_side.provider("ui") as rogue_provider:  # the agent stands up its own provider
        first = asyncio.create_task(rogue_side.ask(one_question(), timeout=10))
        await (await next_pending(rogue_provider)).answer(pick("yes"), by="alice", remember=Remember())
        assert await first == pick("yes")
    async with (await make_broker()).provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(one_question(), timeout=20))
        pending = await next_pending(provider)
        assert asker.rejected_outcomes == 1
        await pending.answer(pick("no"), by="bob")
        assert await asyncio.wait_for(asking, 10) == pick("no")


async def test_no_decision_is_looked_up_for_a_plan_review(make_broker, redis, namespace):
    """Attack 6: a planted 'Approve' for a plan review's fingerprint is never consulted."""
    asker, answering = await make_broker(), await make_broker()
    review = plan_review()
    fp = question_fingerprint(review.questions[0])
    planted = {"id": "forged", "selected": '["Approve"]', "by": "alice", "provider": "ui", "proof": "{}"}
    await redis.hset(f"qb:{{{namespace}}}:decision:ns:{fp}", mapping=planted)
    assert await redis.hgetall(f"qb:{{{namespace}}}:decision:ns:{fp}") == planted  # it landed
    async with answering.provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(review, timeout=20))
        pending = await next_pending(provider)
        assert asker.rejected_outcomes == 0  # not even found: no lookup for intent questions
        await pending.answer(pick("Refuse", "plan"), by="bob")
        assert await asyncio.wait_for(asking, 10) == pick("Refuse", "plan")


async def test_a_keyed_question_pre_answered_by_the_agent_is_not_an_answer(make_broker, redis, namespace):
    """Attack 7: before asking, write the durable key, a settled request hash and an outcome."""
    asker, answering = await make_broker(), await make_broker()
    request = one_question()
    k = f"qb:{{{namespace}}}:"
    durable = asker.keys.durable(None, "deploy-1")
    await redis.set(durable, "planted")
    digest = hashlib.sha1(encode(request)).hexdigest()
    await redis.hset(f"{k}req:planted", mapping={"state": "answered", "digest": digest, "request": "x", "client": "c"})
    await redis.set(f"{k}ans:planted", FORGED)
    async with answering.provider("ui"):
        assert await code_of(asker.ask(request, key="deploy-1", timeout=3)) == "ASK_TIMED_OUT"
    assert asker.rejected_outcomes >= 1  # the kept outcome was read, and refused


async def test_asking_without_a_trusted_key_is_a_coded_error(redis_server, namespace):
    async with Broker(redis_server.url, namespace) as broker:
        assert await code_of(broker.ask(one_question())) == "NO_TRUSTED_KEY"
        with pytest.raises(Exception) as raised:
            async with broker.provider("ui"):
                pass
        assert getattr(raised.value, "code", None) == "NO_SIGNING_KEY"


async def _none_left(redis: Redis, key: str) -> bool:
    return int(await redis.llen(key)) == 0  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]


async def _value(result: Any) -> bool:
    return bool(await result) if inspect.isawaitable(result) else bool(result)


async def _refused_in_status(broker: Broker) -> bool:
    return (await namespace_status(broker)).rejected_answers == 1


async def test_a_genuine_answer_replayed_onto_a_new_keyed_ask_is_not_an_answer(make_broker, redis, namespace):
    """Attack 7 with a genuine signature (found by an independent review): a human approved one ask;
    the agent points a new key at that request and rewrites its hash and outcome key, so that a new
    keyed ask 're-attaches' to the old approval."""
    asker, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        first = asyncio.create_task(asker.ask(one_question(), key="deploy-1", timeout=10))
        await (await next_pending(provider)).answer(pick("yes"), by="alice")
        assert await first == pick("yes")
        [answered] = [e for _, e in await redis.xrange(f"qb:{{{namespace}}}:audit") if e.get("event") == "answered"]
        old, genuine = answered["rid"], answered["outcome"]
        k = f"qb:{{{namespace}}}:"
        digest = hashlib.sha1(encode(one_question())).hexdigest()
        await redis.set(asker.keys.durable(None, "deploy-2"), old)  # a new key, pointed at the old request
        await redis.hset(
            f"{k}req:{old}", mapping={"state": "answered", "digest": digest, "request": "x", "client": "c"}
        )
        await redis.set(f"{k}ans:{old}", genuine)
        assert await code_of(asker.ask(one_question(), key="deploy-2", timeout=3)) == "ASK_TIMED_OUT"
        assert asker.rejected_outcomes >= 1  # the replayed answer was read, and refused


async def test_an_answer_for_a_request_this_process_does_not_wait_on_is_not_taken(make_broker):
    """With no ask of its own to check a notice against (a keyed ask's re-attach in flight, say),
    the asker takes errors only (found by an independent review: it had taken anything)."""
    asker = await make_broker()
    assert not asker._core.accepts("nobody-waits", FORGED)
    assert asker._core.accepts(
        "nobody-waits", '{"error":{"name":"UserQuestionError","code":"ASK_CANCELLED","message":"x"}}'
    )


async def test_a_forged_edit_is_not_an_answer(make_broker, redis, namespace):
    """Edit before approve: the agent approves its own call with arguments of its choosing. The
    edit is part of the signed outcome, so it counts only as the human's signed answer does."""
    from broker import (
        AskUserQuestionAnswer,
        AskUserQuestionAnswerItem,
        AskUserQuestionItem,
        AskUserQuestionRequest,
        Editable,
    )
    from tests.helpers import options

    item = AskUserQuestionItem(
        id="c1",
        question="Allow delete: `build/`?",
        options=options("Approve", "Deny"),
        editable=Editable(arguments={"path": "build/"}, approve="Approve"),
    )
    forged = '{"answer":{"answers":[{"id":"c1","selected":["Approve"],"edited":{"path":"/"}}]}}'
    asker, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(AskUserQuestionRequest(questions=(item,)), timeout=20))
        rid, client = await waiting_request(redis, namespace)
        inbox = f"qb:{{{namespace}}}:inbox:{client}"
        await redis.rpush(inbox, f"{rid} {forged}")
        await redis.set(f"qb:{{{namespace}}}:ans:{rid}", forged)  # and where a sweep would read it
        await until(lambda: asker.rejected_outcomes >= 1)
        assert not asking.done()
        human = AskUserQuestionAnswer(
            answers=(AskUserQuestionAnswerItem(id="c1", selected=("Approve",), edited={"path": "build/cache"}),)
        )
        await (await next_pending(provider)).answer(human, by="alice")
        got = await asyncio.wait_for(asking, 10)
        assert got.answers[0].edited == {"path": "build/cache"}  # the human's edit, not the forged one


@pytest.mark.parametrize(
    ("rewrite", "lands_at"),
    [
        pytest.param({"agent": "intruder"}, "decision:agent:intruder:", id="agent-rewritten"),
        pytest.param({"scope": "namespace", "agent": ""}, "decision:ns:", id="widened-to-the-namespace"),
    ],
)
async def test_a_decision_whose_scope_or_agent_is_rewritten_is_not_an_answer(
    make_broker, redis, namespace, rewrite, lands_at
):
    """Attack 5 on a genuine decision: alice remembered 'yes' for the agent builder only; whoever can write
    the decision hashes without the signing key (an asker sharing one Redis user with its providers, or
    a maintenance user) rewrites its scope or agent, in its proof and its summary, and puts it where
    another agent's lookup finds it. Its signature covers scope and agent, so a human is asked."""
    asker, intruding, answering = await make_broker(), await make_broker(), await make_broker()
    fp = question_fingerprint(one_question().questions[0])
    k = f"qb:{{{namespace}}}:"
    async with answering.provider("ui") as provider:
        async with asker.agent("builder") as builder:
            first = asyncio.create_task(builder.ask(one_question(), timeout=10))
            await (await next_pending(provider)).answer(pick("yes"), by="alice", remember=Remember(scope="agent"))
            assert await first == pick("yes")
            assert await builder.ask(one_question(), timeout=5) == pick("yes")  # the genuine decision answers
        genuine = await redis.hgetall(f"{k}decision:agent:builder:{fp}")
        proof, summary = json.loads(genuine["proof"]), json.loads(genuine["summary"])
        assert (proof["scope"], proof["agent"]) == ("agent", "builder")
        forged = {
            **genuine,
            "proof": json.dumps({**proof, **rewrite}),
            "summary": json.dumps({**summary, **rewrite, "agent": rewrite["agent"] or None}),
        }
        await redis.hset(f"{k}{lands_at}{fp}", mapping=forged)
        await redis.pexpire(f"{k}{lands_at}{fp}", 600_000)
        async with intruding.agent("intruder") as intruder:
            asking = asyncio.create_task(intruder.ask(one_question(), timeout=20))
            pending = await next_pending(provider)  # a human is asked after all
            assert intruding.rejected_outcomes == 1  # ask.lua took the rewritten decision; the asker refused it
            asklog = await redis.xrange(f"{k}asklog")
            taken = [e["by"] for _, e in asklog if e.get("event") == "answered" and e.get("agent") == "intruder"]
            assert taken == [f"decision:{genuine['id']}"]  # the attack fired
            await pending.answer(pick("no"), by="bob")
            assert await asyncio.wait_for(asking, 10) == pick("no")  # the human's answer, not alice's for builder
