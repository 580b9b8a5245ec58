"""Remembered decisions (issue 15), on a real redis-server, the provider in its own process.

Each rule of docs/protocol.md "Remembered decisions" has a test here that fails without it:
a decision answers a later identical ask at once (with the new ids, no provider needed), only
in its scope, never for an asker that opted out, never for a partial match; it is listed,
revoked and expires; a decision set while identical asks race in never answers one twice.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import (
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PlanReviewIntent,
    Remember,
    UserQuestionError,
    question_fingerprint,
)
from broker._keys import Keys
from broker.errors import BAD_ANSWER, BAD_REQUEST, NO_PROVIDER
from tests.helpers import answer, pick, trail
from tests.redis_server import RedisServer
from tests.workers.procs import FollowedProcess

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(60)


def deploy(qid: str = "q1", agent: str | None = None, *, question: str = "Deploy to production?") -> Any:
    item = AskUserQuestionItem(
        id=qid,
        question=question,
        header="Deploy",
        options=(AskUserQuestionOption(label="yes"), AskUserQuestionOption(label="no")),
    )
    return AskUserQuestionRequest(questions=(item,), agent=agent)


class ProviderProcess(FollowedProcess):
    """tests/decision_provider.py in its own process; its stdout lines collected as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        super().__init__(process, process.stdout)

    @classmethod
    async def start(cls, url: str, namespace: str, *, scope: str, ttl: float = 3600, label: str = "yes") -> Any:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.decision_provider",
            url,
            namespace,
            "ui-proc",
            label,
            scope,
            str(ttl),
            "alice",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        provider = cls(process)
        await provider.expect("HOLDING")
        return provider

    async def got_count(self, at_least: int) -> int:
        """How many requests it was given, once it said so for ``at_least`` (its stdout lags the answers)."""
        if at_least:
            await self.expect("GOT", nth=at_least)
        await asyncio.sleep(0.2)  # one more, had there been one, would show by now
        return len(self.got())

    async def expect(self, prefix: str, within: float = 15.0, nth: int = 1) -> str:
        def nth_found() -> str | None:
            found = [line for line in self.lines if line.startswith(prefix)]
            return found[nth - 1] if len(found) >= nth else None

        return await asyncio.wait_for(self.until(nth_found, f"{prefix!r} #{nth}"), within)

    def got(self) -> list[str]:
        return [line.split()[1] for line in self.lines if line.startswith("GOT")]

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            await asyncio.wait_for(self.process.wait(), 10)
        await asyncio.wait_for(self.stopped_reading(), 10)


@pytest.fixture
async def provider_process(redis_server: RedisServer, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    started: list[ProviderProcess] = []

    async def start(**options: Any) -> ProviderProcess:
        provider = await ProviderProcess.start(redis_server.url, namespace, **options)
        started.append(provider)
        return provider

    yield start
    for provider in started:
        await provider.stop()


async def audit(redis: Redis, namespace: str, event: str) -> list[dict[str, str]]:
    """``event``s of the audit and the askers' log (a decision's answer is an asker's claim)."""
    return [fields for fields in await trail(redis, Keys(namespace)) if fields["event"] == event]


# -- the fingerprint -----------------------------------------------------------------------------


def test_the_fingerprint_is_sha256_of_the_documented_compact_json() -> None:
    item = deploy().questions[0]
    canonical = json.dumps(
        ["Deploy to production?", "Deploy", ["yes", "no"], False, None], separators=(",", ":"), ensure_ascii=False
    )
    import hashlib

    assert question_fingerprint(item) == hashlib.sha256(canonical.encode()).hexdigest()
    plan = AskUserQuestionItem(
        id="p", question="Ship «it»?\n", options=(AskUserQuestionOption(label="A"),), multi_select=True,
        detail="# plan", intent=PlanReviewIntent(approve="A"),
    )  # fmt: skip
    canonical = json.dumps(
        ["Ship «it»?\n", None, ["A"], True, "plan-review"], separators=(",", ":"), ensure_ascii=False
    )
    assert question_fingerprint(plan) == hashlib.sha256(canonical.encode()).hexdigest()


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({"id": "other"}, True),
        ({"detail": "more words"}, True),
        ({"options": (AskUserQuestionOption(label="yes", description="d"), AskUserQuestionOption(label="no"))}, True),
        ({"question": "Deploy to staging?"}, False),
        ({"header": "Ops"}, False),
        ({"options": (AskUserQuestionOption(label="no"), AskUserQuestionOption(label="yes"))}, False),
        ({"multi_select": True}, False),
        ({"detail": "x", "intent": PlanReviewIntent(approve="yes")}, False),
    ],
    ids=["id", "detail", "description", "question", "header", "labels", "multiSelect", "intent"],
)
def test_the_fingerprint_covers_what_the_human_decides_on_and_not_ids(change: dict[str, Any], same: bool) -> None:
    import msgspec

    item = deploy().questions[0]
    assert (question_fingerprint(msgspec.structs.replace(item, **change)) == question_fingerprint(item)) is same


def test_remember_checks_its_scope_and_ttl() -> None:
    for bad in ({"scope": "fleet"}, {"ttl": 0}, {"ttl": 10**9}):
        with pytest.raises(UserQuestionError) as caught:
            Remember(**bad)
        assert caught.value.code == BAD_REQUEST


# -- across processes ----------------------------------------------------------------------------


async def test_a_namespace_decision_answers_a_later_ask_at_once_with_its_own_ids_even_without_a_provider(
    make_broker: Callable[..., Any], provider_process: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    provider = await provider_process(scope="namespace")
    first, second = await make_broker(), await make_broker()
    assert await first.ask(deploy("q1"), timeout=15) == pick("yes", "q1")
    assert (await provider.expect("ANSWERED")).endswith(" 1")
    [remembered] = await audit(redis, namespace, "remembered")
    assert remembered["by"] == "alice" and remembered["provider"] == "ui-proc"

    answered = await second.ask(deploy("deploy-2"), timeout=5)
    assert answered == pick("yes", "deploy-2")  # the new request's ids
    assert await provider.got_count(1) == 1  # never presented
    decided = [a for a in await audit(redis, namespace, "answered") if a["by"].startswith("decision:")]
    assert len(decided) == 1
    assert decided[0]["by"] == f"decision:{remembered['decision']}"
    assert decided[0]["decided_by"] == "alice via ui-proc"

    await provider.stop()  # no provider at all: the decision still answers
    await redis.delete(f"qb:{{{namespace}}}:standbys", f"qb:{{{namespace}}}:provider")  # killed: no release
    assert await second.ask(deploy("q3"), timeout=5) == pick("yes", "q3")
    with pytest.raises(UserQuestionError) as caught:
        await second.ask(deploy("q4", question="Something new?"), timeout=5)
    assert caught.value.code == NO_PROVIDER


async def test_an_agent_decision_answers_only_that_agents_asks(
    make_broker: Callable[..., Any], provider_process: Callable[..., Any]
) -> None:
    provider = await provider_process(scope="agent")
    broker: Broker = await make_broker()
    async with broker.agent("builder") as builder, broker.agent("other") as other:
        assert await builder.ask(deploy("q1"), timeout=15) == pick("yes")
        await provider.expect("ANSWERED")
        assert await builder.ask(deploy("q2"), timeout=5) == pick("yes", "q2")
        assert await provider.got_count(1) == 1
        assert await other.ask(deploy("q1"), timeout=15) == pick("yes")  # a human answered
        assert await provider.got_count(2) == 2
        assert await broker.ask(deploy("q1"), timeout=15) == pick("yes")  # agentless: a human too
        assert await provider.got_count(3) == 3
    decisions = await broker.decisions()  # the agentless answer could not be remembered for an agent
    assert sorted((d.scope, d.agent) for d in decisions) == [("agent", "builder"), ("agent", "other")]


async def test_remember_false_always_reaches_a_human_and_cannot_be_remembered(
    make_broker: Callable[..., Any], provider_process: Callable[..., Any]
) -> None:
    provider = await provider_process(scope="namespace")
    broker: Broker = await make_broker()
    assert await broker.ask(deploy(), timeout=15) == pick("yes")  # remembered
    assert await broker.ask(deploy(), remember=False, timeout=15) == pick("yes")
    assert await provider.got_count(2) == 2
    assert (await provider.expect("GOT", nth=2)).endswith(" 1")  # the provider is told: opted out
    assert (await provider.expect("ANSWERED", nth=2)).endswith(" 0")
    assert len(await broker.decisions()) == 1


async def test_an_ask_that_matches_only_some_questions_reaches_a_human(
    make_broker: Callable[..., Any], provider_process: Callable[..., Any]
) -> None:
    provider = await provider_process(scope="namespace")
    broker: Broker = await make_broker()
    await broker.ask(deploy("q1"), timeout=15)
    both = AskUserQuestionRequest(questions=(deploy("a").questions[0], deploy("b", question="Notify?").questions[0]))
    assert await broker.ask(both, timeout=15) == answer(("a", ("yes",), None), ("b", ("yes",), None))
    assert await provider.got_count(2) == 2
    # now both are remembered: the batch is answered at once
    assert await broker.ask(both, timeout=5) == answer(("a", ("yes",), None), ("b", ("yes",), None))
    assert await provider.got_count(2) == 2


async def test_decisions_are_listed_revoked_and_expire(
    make_broker: Callable[..., Any], provider_process: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    provider = await provider_process(scope="namespace", ttl=30)
    broker: Broker = await make_broker()
    await broker.ask(deploy(), timeout=15)
    [decision] = await broker.decisions()
    assert (decision.scope, decision.agent, decision.by, decision.provider) == ("namespace", None, "alice", "ui-proc")
    assert decision.question == "Deploy to production?" and decision.header == "Deploy"
    assert decision.selected == ("yes",)
    assert decision.expires_ms - decision.at_ms == 30_000
    assert decision.fingerprint == question_fingerprint(deploy().questions[0])

    assert await broker.revoke_decision(decision.id, by="bob")
    assert not await broker.revoke_decision(decision.id, by="bob")  # a retry changes nothing
    [forgotten] = await audit(redis, namespace, "forgotten")
    assert (forgotten["decision"], forgotten["by"]) == (decision.id, "bob")
    assert await broker.decisions() == []
    await broker.ask(deploy(), timeout=15)  # a human again, who remembers it again
    assert await provider.got_count(2) == 2
    assert len(await broker.decisions()) == 1


async def test_a_decision_expires_and_its_index_is_pruned(make_broker: Callable[..., Any], redis: Redis) -> None:
    broker: Broker = await make_broker()
    keys = broker.keys
    async with broker.provider("ui") as provider:

        async def answer_next(remember: Remember | None) -> None:
            pending = await anext(aiter(provider))
            await pending.answer(pick("no"), remember=remember)

        answering = asyncio.ensure_future(answer_next(Remember(ttl=1)))
        assert await broker.ask(deploy(), timeout=10) == pick("no")
        await answering
        assert len(await broker.decisions()) == 1
        await asyncio.sleep(1.2)
        assert await broker.decisions() == []  # expired: not listed
        answering = asyncio.ensure_future(answer_next(None))
        assert await broker.ask(deploy(), timeout=10) == pick("no")  # a human answered
        await answering
        # remembering another prunes the expired id from the index; the index expires with the last one
        answering = asyncio.ensure_future(answer_next(Remember(ttl=60)))
        await broker.ask(deploy(question="Other?"), timeout=10)
        await answering
        assert len(await redis.hkeys(keys.decisions)) == 1  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
        assert await redis.zcard(keys.decision_expiry) == 1
        assert 0 < await redis.pttl(keys.decisions) <= 60_000


async def test_free_text_skips_and_agentless_agent_scope_cannot_be_remembered(make_broker: Callable[..., Any]) -> None:
    broker: Broker = await make_broker()
    async with broker.provider("ui") as provider:
        asking = asyncio.ensure_future(broker.ask(deploy(), timeout=10))
        pending = await anext(aiter(provider))
        for bad, remember in [
            (answer(("q1", (), "only on Fridays")), Remember()),
            (answer(("q1", (), None)), Remember()),
            (pick("yes"), Remember(scope="agent")),
        ]:
            assert not pending.can_remember(bad, remember.scope)
            with pytest.raises(UserQuestionError) as caught:
                await pending.answer(bad, remember=remember)
            assert caught.value.code == BAD_ANSWER
        assert await broker.decisions() == []
        await pending.answer(pick("yes"), remember=Remember())  # still pending: this one lands
        assert await asking == pick("yes")


async def test_a_decision_racing_a_humans_answers_answers_each_ask_once(
    make_broker: Callable[..., Any], provider_process: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    """Identical asks race the human's remembered answer: each is answered exactly once, by the
    human (presented) or by the decision (never presented), and once the decision is set every
    later ask is decided."""
    provider = await provider_process(scope="namespace")
    askers = [await make_broker() for _ in range(3)]

    async def ask(i: int) -> Any:
        return await askers[i % 3].ask(deploy(f"q{i}"), timeout=20)

    # asks start every 10 ms, around the moment the decision lands: until 20 after it did
    tasks: list[asyncio.Task[Any]] = []
    after = 0
    while after < 20 and len(tasks) < 400:
        tasks.append(asyncio.create_task(ask(len(tasks))))
        await asyncio.sleep(0.01)
        if any(line.startswith("ANSWERED") for line in provider.lines):
            after += 1
    n = len(tasks)
    results = await asyncio.gather(*tasks)
    assert results == [pick("yes", f"q{i}") for i in range(n)]
    answered = await audit(redis, namespace, "answered")
    by_request: dict[str, list[dict[str, str]]] = {}
    for event in answered:
        by_request.setdefault(event["rid"], []).append(event)
    assert len(by_request) == n and all(len(events) == 1 for events in by_request.values())
    presented = set(provider.got())
    decided = {rid for rid, [event] in by_request.items() if event["by"].startswith("decision:")}
    assert presented and decided and presented.isdisjoint(decided)
    assert presented | decided == set(by_request)
    # the human's answers all landed (none refused as already answered by a decision)
    assert not [line for line in provider.lines if line.startswith("REFUSED")]
    later = await asyncio.gather(*(ask(i) for i in range(n, n + 20)))
    assert later == [pick("yes", f"q{i}") for i in range(n, n + 20)]
    assert set(provider.got()) == presented


async def test_a_presented_request_is_not_auto_answered_by_a_decision_set_meanwhile(
    make_broker: Callable[..., Any],
) -> None:
    broker: Broker = await make_broker()
    async with broker.provider("ui") as provider:
        requests = aiter(provider)
        first = asyncio.ensure_future(broker.ask(deploy("a"), timeout=10))
        second = asyncio.ensure_future(broker.ask(deploy("b"), timeout=10))
        one, two = await anext(requests), await anext(requests)
        await one.answer(pick("yes", one.request.questions[0].id), remember=Remember())
        await two.answer(pick("no", two.request.questions[0].id), by="bob")  # the human's own answer wins
        results = {(await first).answers[0].selected, (await second).answers[0].selected}
        assert results == {("yes",), ("no",)}


async def test_question_ids_of_any_text_come_back_exactly(make_broker: Callable[..., Any]) -> None:
    broker: Broker = await make_broker()
    async with broker.provider("ui") as provider:
        asking = asyncio.ensure_future(broker.ask(deploy("q1"), timeout=10))
        await (await anext(aiter(provider))).answer(pick("no"), remember=Remember())
        await asking
    odd = 'q "1"/\\ «é» \n'
    assert await broker.ask(deploy(odd), timeout=5) == pick("no", odd)


def test_a_plan_review_is_never_remembered() -> None:
    from broker.decisions import why_not_rememberable
    from tests.helpers import plan_review

    request = plan_review()
    why = why_not_rememberable(request, pick("Approve", "plan"), Remember(), opted_out=False)
    assert why is not None and "plan" in why
    assert why_not_rememberable(deploy(), pick("yes"), Remember(), opted_out=False) is None


async def test_a_keyed_ask_is_answered_by_a_decision_too(make_broker: Callable[..., Any]) -> None:
    broker: Broker = await make_broker()
    async with broker.provider("ui") as provider:
        asking = asyncio.ensure_future(broker.ask(deploy(), timeout=10))
        await (await anext(aiter(provider))).answer(pick("yes"), remember=Remember())
        await asking
    assert await broker.ask(deploy("k1"), key="release", timeout=5) == pick("yes", "k1")  # no provider up
