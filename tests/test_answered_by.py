"""Who answered: ``AskUserQuestionAnswer.answered_by``, read from the verified seal, on a real redis-server.

The answering side seals each outcome with ``by`` (broker/signing.py); an asker learns it only from
a seal (or a remembered decision's signature) it verified, never from anything its own credentials
can write, and the answer itself stays the seeds' answer (equal to one built by hand, encoded alike).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, Broker, Remember
from broker.types import encode
from tests.helpers import code_of, next_pending, one_question, pick

pytestmark = pytest.mark.timeout(30)


async def test_an_answer_names_who_answered_as_its_seal_says(make_broker: Callable[..., Any]) -> None:
    asker, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(one_question(), timeout=10))
        await (await next_pending(provider)).answer(pick("yes"), by="alice")
        got = await asyncio.wait_for(asking, 10)
        assert got.answered_by == "alice"
        assert got == pick("yes") and encode(got) == encode(pick("yes"))  # the seeds' answer, as before
        assert pick("yes").answered_by is None  # built by hand: nobody's seal names anyone

        anonymous = asyncio.create_task(asker.ask(one_question(), timeout=10))
        await (await next_pending(provider)).answer(pick("no"))  # a provider that names nobody
        assert (await asyncio.wait_for(anonymous, 10)).answered_by is None


async def test_a_remembered_decision_names_who_set_it(make_broker: Callable[..., Any]) -> None:
    asker, answering = await make_broker(), await make_broker()
    async with answering.provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(one_question(), timeout=10))
        await (await next_pending(provider)).answer(pick("yes"), by="alice", remember=Remember())
        await asyncio.wait_for(asking, 10)
    again = await asker.ask(one_question(), timeout=5)  # no provider up: the decision answers
    assert again == pick("yes") and again.answered_by == "alice"


async def test_an_answerer_that_passes_the_answer_on_keeps_its_name_and_one_of_its_own_names_nobody(
    make_broker: Callable[..., Any],
) -> None:
    asker, answering = await make_broker(), await make_broker()

    async def passes_on(request: AskUserQuestionRequest, next_: Callable[[], Any]) -> AskUserQuestionAnswer:
        return await next_()

    dispose = asker.on_request(passes_on)
    async with answering.provider("ui") as provider:
        asking = asyncio.create_task(asker.ask(one_question(), timeout=10))
        await (await next_pending(provider)).answer(pick("yes"), by="alice")
        assert (await asyncio.wait_for(asking, 10)).answered_by == "alice"
    dispose()

    async def answers_itself(request: AskUserQuestionRequest, next_: Callable[[], Any]) -> AskUserQuestionAnswer:
        return pick("no")

    asker.on_request(answers_itself)
    got = await asker.ask(one_question(), timeout=5)
    assert got == pick("no") and got.answered_by is None  # the asker's own code: no seal, no name


async def test_a_sealed_answer_whose_by_the_agent_rewrote_is_not_an_answer(
    make_broker: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    """The agent, with its own credentials, replays a genuine answer to its keyed ask (a re-attach takes it,
    as the control shows) with the seal's ``by`` rewritten to someone it would rather name: refused."""
    asker: Broker = await make_broker()
    answering: Broker = await make_broker()
    k = f"qb:{{{namespace}}}:"
    async with answering.provider("ui") as provider:
        first = asyncio.create_task(asker.ask(one_question(), key="deploy-1", timeout=10))
        await (await next_pending(provider)).answer(pick("yes"), by="alice")
        assert (await asyncio.wait_for(first, 10)).answered_by == "alice"
    [answered] = [e for _, e in await redis.xrange(f"{k}audit") if e.get("event") == "answered"]
    old, genuine = answered["rid"], answered["outcome"]
    sealed = json.loads(genuine)
    sealed["proof"]["by"] = "the-cto"
    rewritten = json.dumps(sealed)

    async def replay(outcome: str) -> None:
        digest = hashlib.sha1(encode(one_question())).hexdigest()
        await redis.set(asker.keys.durable(None, "deploy-1"), old)
        await redis.hset(  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
            f"{k}req:{old}", mapping={"state": "answered", "digest": digest, "request": "x", "client": "c"}
        )
        await redis.set(f"{k}ans:{old}", outcome)

    await replay(rewritten)
    assert await code_of(asker.ask(one_question(), key="deploy-1", timeout=2)) == "ASK_TIMED_OUT"
    assert asker.rejected_outcomes >= 1  # the rewritten seal was read, and refused

    await replay(genuine)  # the control: the same replay, the seal as the provider made it
    got = await asyncio.wait_for(asker.ask(one_question(), key="deploy-1", timeout=5), 10)
    assert got == pick("yes") and got.answered_by == "alice"
