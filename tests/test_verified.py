"""Verified or claimed: an agent id counts as verified only when a pinned gateway attested that very ask.

An asker holding a Redis user names whatever agent id it likes; a gateway (``qbroker gateway``) decides
the id from a bearer token and attests each ask it enqueues with its own key (broker/signing.py). Each
attack here first shows that its write lands (the stream entry carries the forged attestation), then
that the provider still shows the agent id as claimed: on the card, its askers and the audit entry of
the answer, and a rule requiring ``verified = true`` does not answer it (docs/security.md, rows 9-12).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Broker, PendingRequest, SigningKey, namespace_status
from tests.helpers import SIGNING_KEY, next_pending, one_question, pick
from workers.answering.auto.rules import parse_rules
from workers.answering.web.render import asking_view
from workers.operating.status.view import format_status

pytestmark = pytest.mark.timeout(30)

GATEWAY_KEY = SigningKey.generate()
"""the gateway's own key: the providers below pin its public half"""


async def gateway_and_provider(make_broker: Callable[..., Any], attest_key: SigningKey) -> tuple[Broker, Broker]:
    asking = await make_broker(attest_key=attest_key)
    answering = await make_broker(gateway_keys=[GATEWAY_KEY.public_text])
    return asking, answering


async def ask_entry(redis: Redis, namespace: str, agent_id: str) -> dict[str, str]:
    """The ask's stream entry as it landed (the attack's write), once it is there."""
    for _ in range(250):
        for _id, fields in await redis.xrange(f"qb:{{{namespace}}}:requests"):
            if fields.get("kind") == "ask" and fields.get("agent") == agent_id:
                return dict(fields)
        await asyncio.sleep(0.02)
    raise AssertionError("the ask never landed")


async def audit_asker(redis: Redis, namespace: str, rid: str) -> str:
    entries = await redis.xrange(f"qb:{{{namespace}}}:audit")
    [entry] = [e for _, e in entries if e.get("event") == "answered" and e.get("rid") == rid]
    return str(entry["asker"])


async def faces_say(answering: Broker, pending: PendingRequest, identity: str) -> None:
    """The page's card, ``qbroker status`` and the terminal's banner say it the same way."""
    view = asking_view(pending)
    assert view["verified"] is (identity == "verified")
    assert [asker["verified"] for asker in view["askers"]] == [identity == "verified"]
    status = await namespace_status(answering)
    assert [p.verified for p in status.pending] == [identity == "verified"]
    [row] = [line for line in format_status(status).splitlines() if pending.request_id in line]
    assert f" {identity} " in row
    assert "IDENTITY" in format_status(status)


async def test_an_ask_the_pinned_gateway_attested_is_verified_everywhere(make_broker, redis, namespace):
    gateway, answering = await gateway_and_provider(make_broker, GATEWAY_KEY)
    async with answering.provider("ui") as provider, gateway.agent("ci-bot") as agent:
        asking = asyncio.create_task(agent.ask(one_question(), timeout=20))
        pending = await next_pending(provider)
        assert pending.verified and [a.verified for a in pending.askers] == [True]
        await faces_say(answering, pending, "verified")
        await pending.answer(pick("yes"), by="alice")
        assert await asyncio.wait_for(asking, 10) == pick("yes")
    assert await audit_asker(redis, namespace, pending.request_id) == "verified"


async def test_an_ask_without_attestation_is_claimed(make_broker, redis, namespace):
    asker = await make_broker()
    answering = await make_broker(gateway_keys=[GATEWAY_KEY.public_text])
    async with answering.provider("ui") as provider, asker.agent("ci-bot") as agent:
        asking = asyncio.create_task(agent.ask(one_question(), timeout=20))
        pending = await next_pending(provider)
        assert not pending.verified and [a.verified for a in pending.askers] == [False]
        await faces_say(answering, pending, "claimed")
        await pending.answer(pick("yes"), by="alice")
        await asyncio.wait_for(asking, 10)
    assert await audit_asker(redis, namespace, pending.request_id) == "claimed"


async def test_an_attestation_signed_by_the_askers_own_key_is_claimed(make_broker, redis, namespace):
    """The asker attests its own ask with a key of its own: the write lands, no pinned key signed it."""
    own = SigningKey.generate()
    asker, answering = await gateway_and_provider(make_broker, own)
    async with answering.provider("ui") as provider, asker.agent("ci-bot") as agent:
        asking = asyncio.create_task(agent.ask(one_question(), timeout=20))
        entry = await ask_entry(redis, namespace, "ci-bot")
        assert entry["attest"].startswith(own.id + ":")  # the forged attestation landed
        pending = await next_pending(provider)
        assert not pending.verified
        await pending.answer(pick("yes"), by="alice")
        await asyncio.wait_for(asking, 10)
    assert await audit_asker(redis, namespace, pending.request_id) == "claimed"


class _Copying(SigningKey):
    """An asker's 'key' that attaches an attestation it copied from the stream instead of signing."""

    copied = ""

    def attest(self, **_: str) -> str:
        return self.copied


async def test_an_attestation_copied_from_another_request_is_claimed(make_broker, redis, namespace):
    gateway, answering = await gateway_and_provider(make_broker, GATEWAY_KEY)
    thief = _Copying.generate()
    assert isinstance(thief, _Copying)
    attacker = await make_broker(attest_key=thief)
    async with answering.provider("ui") as provider:
        async with gateway.agent("ci-bot") as agent:
            genuine = asyncio.create_task(agent.ask(one_question(), timeout=20))
            first = await next_pending(provider)
            assert first.verified
            thief.copied = (await ask_entry(redis, namespace, "ci-bot"))["attest"]
            await first.answer(pick("no"), by="alice")
            await asyncio.wait_for(genuine, 10)
        # The same agent id and the very same request, with the genuine attestation of the one before.
        async with attacker.agent("ci-bot") as claimed:
            asking = asyncio.create_task(claimed.ask(one_question(), timeout=20))
            pending = await next_pending(provider)
            fields = await ask_entry(redis, namespace, "ci-bot")
            assert fields["attest"] == thief.copied and fields["rid"] == pending.request_id  # the copy landed
            assert not pending.verified
            await pending.answer(pick("yes"), by="alice")
            await asyncio.wait_for(asking, 10)


async def test_a_rule_requiring_verified_does_not_answer_a_claimed_ask(make_broker, namespace):
    rules = parse_rules(
        '[[rule]]\nagent = "ci-*"\nverified = true\nselect = "yes"\n\n[default]\ncancel = "ask a human"\n'
    )
    asker = await make_broker()
    answering = await make_broker(gateway_keys=[GATEWAY_KEY.public_text])
    gateway = await make_broker(attest_key=GATEWAY_KEY)
    async with answering.provider("auto") as provider:
        for broker, verified in ((asker, False), (gateway, True)):
            async with broker.agent("ci-bot") as agent:
                asking = asyncio.create_task(agent.ask(one_question(), timeout=20))
                pending = await next_pending(provider)
                assert pending.verified is verified
                decision = rules.decide(namespace, pending.request, verified=pending.verified)
                assert (decision.answer is not None) is verified
                assert decision.lines == ((1,) if verified else (0,))
                await pending.answer(pick("no"), by="auto")
                await asyncio.wait_for(asking, 10)


def test_a_gateway_may_not_hold_a_key_answers_are_signed_with() -> None:
    with pytest.raises(Exception, match="must not be a key answers are signed with"):
        Broker("redis://localhost:1/0", "x", signing_key=SIGNING_KEY, attest_key=SIGNING_KEY)
    with pytest.raises(Exception, match="must not be a key answers are signed with"):
        Broker("redis://localhost:1/0", "x", trusted_keys=[SIGNING_KEY.public_text], attest_key=SIGNING_KEY)


def test_an_attestation_binds_request_digest_agent_and_process() -> None:
    from broker import TrustedKeys
    from broker.signing import attestation_message

    pinned = TrustedKeys([GATEWAY_KEY.public_text])
    ask = {"namespace": "ns", "request_id": "r1", "request_sha": "a" * 64, "agent": "ci-bot", "client": "c1"}
    attestation = GATEWAY_KEY.attest(**ask)
    assert pinned.verify_attestation(attestation, **ask)
    for field, other in (("namespace", "ns2"), ("request_id", "r2"), ("request_sha", "b" * 64), ("agent", "x")):
        assert not pinned.verify_attestation(attestation, **{**ask, field: other}), field
    assert not pinned.verify_attestation(attestation, **{**ask, "client": "c2"})
    # The same bytes signed under another domain (an answer's, a decision's) are no attestation.
    message = attestation_message(**ask)
    for signature in (GATEWAY_KEY.sign(message), GATEWAY_KEY.sign_decision(message)):
        assert not pinned.verify_attestation(f"{GATEWAY_KEY.id}:{signature}", **ask)
    assert not pinned.verify_attestation("", **ask)
