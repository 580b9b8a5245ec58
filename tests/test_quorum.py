"""Quorum policies (broker/answering/quorum.py): approvals that need more than one person, on a real redis-server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from broker import (
    AskUserQuestionItem,
    AskUserQuestionRequest,
    Policies,
    PolicyError,
    Remember,
    UserQuestionError,
    load_policies,
)
from tests.helpers import answer, next_pending, one_question, options, pick, plan_review, question

pytestmark = pytest.mark.timeout(30)

DEPLOYS = """
[[policy]]
name = "deploys"
match = { header = ["Deploy*"] }
approvals = 2
groups = ["sre"]
approve = ["yes"]
"""
"""two of the sre group approve a card headed Deploy..."""

POLICY = (
    """
[groups]
sre = ["alice", "bob", "dave"]
dba = ["erin"]
"""
    + DEPLOYS
    + """
[[policy]]
name = "schema"
match = { text = "drop table" }
approvals = 2
decline = "quorum"
approve = ["yes"]
"""
)


@pytest.fixture
def policies(tmp_path: Path) -> Policies:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return load_policies(path)


def deploy(*labels: str) -> AskUserQuestionRequest:
    return AskUserQuestionRequest(questions=(question("q1", *(labels or ("yes", "no")), header="Deploy prod"),))


def schema() -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id="q1", question="DROP TABLE users?", options=options("yes", "no"))
    return AskUserQuestionRequest(questions=(item,))


async def audit(broker: Any) -> list[dict[str, str]]:
    return [fields for _, fields in await broker.commands.call("XRANGE", broker.keys.audit, "-", "+")]


async def not_yet(task: asyncio.Task[Any], seconds: float = 0.4) -> None:
    await asyncio.sleep(seconds)
    assert not task.done(), "the asker got an answer before the quorum"


async def test_two_of_sre_approve_and_only_then_the_asker_has_the_answer(make_broker, policies) -> None:
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        card = await next_pending(provider)
        first = await policies.vote(card, pick("yes"), by="alice")
        assert first is not None and first.decided is None and first.approved_by == ("alice",)
        assert first.may_still == ("bob", "dave")
        await not_yet(asked)
        again = await policies.vote(card, pick("yes"), by="alice")  # the same person twice is one approval
        assert again is not None and again.decided is None
        await not_yet(asked)
        done = await policies.vote(card, pick("yes"), by="bob")
        assert done is not None and done.by == ("alice", "bob")
        assert await asked == pick("yes")
    trail = await audit(broker)
    assert [(e["by"], e["verdict"]) for e in trail if e["event"] == "vote"] == [
        ("alice", "approve"),
        ("bob", "approve"),
    ]
    assert [e["by"] for e in trail if e["event"] == "answered"] == ["alice, bob"]


async def test_a_non_member_is_refused_and_not_counted(make_broker, policies) -> None:
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        card = await next_pending(provider)
        with pytest.raises(UserQuestionError) as refused:
            await policies.vote(card, pick("yes"), by="erin")
        assert refused.value.code == "NOT_APPROVER"
        await policies.vote(card, pick("yes"), by="alice")
        await not_yet(asked)
        tally = await policies.current(card)
        assert tally is not None and tally.approved_by == ("alice",)
        await policies.vote(card, pick("yes"), by="dave")
        assert await asked == pick("yes")


async def test_one_decline_decides_at_once(make_broker, policies) -> None:
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        card = await next_pending(provider)
        await policies.vote(card, pick("yes"), by="alice")
        declined = await policies.vote(card, pick("no"), by="bob")
        assert declined is not None and declined.by == ("bob",)
        assert await asked == pick("no")
        # a dismissal declines too
        dismissed = asyncio.create_task(broker.ask(deploy("yes", "no", "later"), timeout=20))
        card = await next_pending(provider)
        await policies.vote(card, None, by="dave", message="not during the freeze")
        with pytest.raises(UserQuestionError) as cancelled:
            await dismissed
        assert cancelled.value.code == "ASK_CANCELLED" and "freeze" in cancelled.value.message


async def test_a_policy_may_need_a_quorum_to_decline_too(make_broker, policies) -> None:
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(schema(), timeout=20))
        card = await next_pending(provider)
        await policies.vote(card, pick("no"), by="carol")  # no groups: anyone who may answer
        await not_yet(asked)
        await policies.vote(card, pick("yes"), by="erin")
        await not_yet(asked)
        await policies.vote(card, pick("no"), by="frank")
        assert await asked == pick("no")


async def test_a_plan_review_approves_with_its_approve_label(make_broker, tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[groups]\nsre = ["a", "b"]\n[[policy]]\nname = "plans"\nmatch = { intent = "plan-review" }\n'
                    'approvals = 2\ngroups = ["sre"]\n')  # fmt: skip
    policies = load_policies(path)
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(plan_review(), timeout=20))
        card = await next_pending(provider)
        tally = await policies.vote(card, pick("Approve", "plan"), by="a")
        assert tally is not None and tally.approved_by == ("a",)
        await not_yet(asked)
        await policies.vote(card, pick("Refuse", "plan"), by="b")
        assert await asked == pick("Refuse", "plan")


async def test_approvals_so_far_survive_a_provider_failover(make_broker, policies) -> None:
    asker, first, second = await make_broker(), await make_broker(), await make_broker()
    halfway = asyncio.Event()

    async def standby() -> None:
        async with second.provider("web-2") as provider:
            assert halfway.is_set()
            card = await next_pending(provider)
            tally = await policies.current(card)
            assert tally is not None and tally.approved_by == ("alice",) and tally.decided is None
            await policies.vote(card, pick("yes"), by="bob")

    async with first.provider("web-1") as provider:
        asked = asyncio.create_task(asker.ask(deploy(), timeout=25))
        taking_over = asyncio.create_task(standby())
        card = await next_pending(provider)
        await policies.vote(card, pick("yes"), by="alice")
        await not_yet(asked, 0.2)
        halfway.set()
    assert await asked == pick("yes")
    await taking_over
    assert [e["by"] for e in await audit(asker) if e["event"] == "answered"] == ["alice, bob"]


async def test_a_vote_of_someone_no_longer_in_the_policys_groups_does_not_count(
    make_broker, policies, tmp_path
) -> None:
    """alice voted; then she left sre (the users file changed, and the provider that takes over reads it):
    her stored vote counts neither towards the quorum nor on the card, whose approvals start again."""
    path = tmp_path / "without-alice.toml"
    path.write_text(POLICY.replace('sre = ["alice", "bob", "dave"]', 'sre = ["bob", "dave"]'))
    without_alice = load_policies(path)
    asker, first, second = await make_broker(), await make_broker(), await make_broker()
    async with first.provider("web-1") as provider:
        asked = asyncio.create_task(asker.ask(deploy(), timeout=25))
        voted = await policies.vote(await next_pending(provider), pick("yes"), by="alice")
        assert voted is not None and voted.approved_by == ("alice",)
    async with second.provider("web-2") as provider:
        card = await next_pending(provider)
        now = await without_alice.current(card)
        assert now is not None and now.decided is None and now.approved_by == ()
        assert now.view()["approvedBy"] == [] and now.may_still == ("bob", "dave")
        with pytest.raises(UserQuestionError) as refused:
            await without_alice.vote(card, pick("yes"), by="alice")
        assert refused.value.code == "NOT_APPROVER"
        bob = await without_alice.vote(card, pick("yes"), by="bob")
        assert bob is not None and bob.decided is None and bob.approved_by == ("bob",)
        await not_yet(asked)  # alice's stored vote and bob's would have made two
        await without_alice.vote(card, pick("yes"), by="dave")
        assert await asked == pick("yes")
    assert [e["by"] for e in await audit(asker) if e["event"] == "answered"] == ["bob, dave"]


async def test_a_fenced_provider_cannot_vote(make_broker, policies) -> None:
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        card = await next_pending(provider)
        await broker.commands.call("DEL", broker.keys.provider)  # the lease lapsed
        with pytest.raises(UserQuestionError) as lost:
            await policies.vote(card, pick("yes"), by="alice")
        assert lost.value.code == "LEASE_LOST" and provider.lost
        assert await broker.commands.call("EXISTS", broker.keys.approvals(card.request_id)) == 0
        asked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asked


async def test_a_remembered_decision_does_not_bypass_a_policy(make_broker, policies) -> None:
    broker = await make_broker()
    async with broker.provider("web") as provider:
        # remembered before the policy existed (no policy on this provider)
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        await (await next_pending(provider)).answer(pick("yes"), by="alice", remember=Remember())
        await asked
        plain = asyncio.create_task(broker.ask(one_question(), timeout=20))
        await (await next_pending(provider)).answer(pick("yes"), by="alice", remember=Remember())
        await plain
        assert len(await broker.decisions()) == 2
    async with broker.provider("web-with-policy") as provider:
        from broker.answering.quorum import revoke_covered

        forgotten = await revoke_covered(policies, broker)
        assert len(forgotten) == 1 and len(await broker.decisions()) == 1  # the plain question's stays
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        card = await next_pending(provider)  # reached a human: no lookup answered it
        with pytest.raises(UserQuestionError) as refused:
            await policies.vote(card, pick("yes"), by="alice", remember=Remember())
        assert refused.value.code == "BAD_ANSWER" and "never remembered" in refused.value.message
        await policies.vote(card, pick("yes"), by="alice")
        await policies.vote(card, pick("yes"), by="bob")
        assert await asked == pick("yes")
        assert len(await broker.decisions()) == 1


async def test_an_uncovered_card_is_settled_as_usual(make_broker, policies) -> None:
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(one_question(), timeout=20))
        assert await policies.vote(await next_pending(provider), pick("no"), by="anyone") is None
        assert await asked == pick("no")


def test_a_question_without_a_notion_of_approving_needs_n_identical_answers(policies) -> None:
    from broker.answering.quorum import Vote, tally

    policy = policies.policies[1]
    votes = [Vote("a", True, answer(("q1", (), "x"))), Vote("b", True, answer(("q1", (), "y")), at_ms=1)]
    assert tally(policy, None, votes).decided is None
    votes.append(Vote("c", True, answer(("q1", (), "y")), at_ms=2))
    assert tally(policy, None, votes).by == ("b", "c")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        pytest.param("[[policy]]\napprovals = 0\n", "at least 1", id="zero-approvals"),
        pytest.param('[[policy]]\ngroups = ["nobody"]\n', "no group", id="unknown-group"),
        pytest.param('[[policy]]\nroute = "nobody"\n', "no group", id="unknown-route"),
        pytest.param('[groups]\ns = ["a"]\n[[policy]]\napprovals = 2\ngroups = ["s"]\n', "1 members", id="too-few"),
        pytest.param('[[policy]]\ndecline = "never"\n', "decline", id="bad-decline"),
        pytest.param('[[policy]]\nmatch = { colour = "red" }\n', "match takes", id="unknown-matcher"),
        pytest.param('[[policy]]\nmatch = { text = "(" }\n', "regular expression", id="bad-regex"),
        pytest.param('[[policy]]\nmatch = { priority = "soon" }\n', "unknown priority", id="bad-priority"),
        pytest.param("[[policy]]\nthreshold = 2\n", "unknown field", id="unknown-field"),
        pytest.param('[groups]\nsre = "alice"\n', "[groups]", id="bad-groups"),
    ],
)
def test_a_malformed_policy_file_is_refused_with_what_is_wrong(tmp_path, text, complaint) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=complaint.replace("[", r"\[")):
        load_policies(path)


def test_groups_come_from_the_users_file(tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[[policy]]\napprovals = 2\ngroups = ["sre"]\n')
    policies = load_policies(path, groups={"sre": frozenset({"alice", "bob"})})
    assert policies.voters(policies.policies[0]) == frozenset({"alice", "bob"})


ESCALATING = (
    """
[groups]
sre = ["alice", "bob"]
leads = ["lee"]
billing = ["erin"]
"""
    + DEPLOYS
    + """escalate = { after = "600ms", to = "leads" }

[[policy]]
name = "billing"
match = { text = "invoice" }
route = "billing"
escalate = { after = 0.6, to = "leads" }
"""
)


async def test_after_its_delay_the_escalation_group_may_vote_too(make_broker, tmp_path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(ESCALATING)
    policies = load_policies(path)
    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        card = await next_pending(provider)
        with pytest.raises(UserQuestionError) as refused:  # not yet: the card is the sre's for 600 ms
            await policies.vote(card, pick("yes"), by="lee")
        assert refused.value.code == "NOT_APPROVER"
        first = await policies.vote(card, pick("yes"), by="alice")
        assert first is not None and first.may_still == ("bob",) and first.view()["escalated"] is False
        assert first.view()["escalatesTo"] == "leads"
        await asyncio.sleep(0.7)
        now = await policies.current(card)
        assert now is not None and now.may_still == ("bob", "lee") and now.view()["escalated"] is True
        done = await policies.vote(card, pick("yes"), by="lee")
        assert done is not None and done.by == ("alice", "lee")
        assert await asked == pick("yes")


async def test_a_routed_card_is_seen_and_answered_by_the_escalation_group_after_its_delay(
    make_broker, tmp_path
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(ESCALATING)
    policies = load_policies(path)
    broker = await make_broker()
    async with broker.provider("web") as provider:
        item = AskUserQuestionItem(id="q1", question="Pay this invoice?", options=options("yes", "no"))
        asked = asyncio.create_task(broker.ask(AskUserQuestionRequest(questions=(item,)), timeout=20))
        card = await next_pending(provider)
        assert policies.may_see(card, "erin") and not policies.may_see(card, "lee")
        with pytest.raises(UserQuestionError) as refused:
            await policies.vote(card, pick("yes"), by="lee")
        assert refused.value.code == "NOT_APPROVER"
        await asyncio.sleep(0.7)
        assert policies.may_see(card, "lee") and not policies.may_see(card, "bob")
        await policies.vote(card, pick("yes"), by="lee")
        assert await asked == pick("yes")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        pytest.param('[[policy]]\nescalate = { after = "soon", to = "x" }\n', "escalate.after", id="bad-delay"),
        pytest.param('[[policy]]\nescalate = "leads"\n', "escalate is", id="not-a-table"),
        pytest.param(
            '[groups]\ns = ["a"]\n[[policy]]\nroute = "s"\nescalate = { after = "1m", to = "nobody" }\n',
            "no group",
            id="unknown-group",
        ),
        pytest.param(
            '[groups]\ns = ["a"]\n[[policy]]\nescalate = { after = "1m", to = "s" }\n', "neither", id="nothing-to-widen"
        ),
    ],
)
def test_a_malformed_escalation_is_refused(tmp_path, text, complaint) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=complaint):
        load_policies(path)


async def test_votes_are_chained_into_the_audit_and_it_verifies(make_broker, policies, redis) -> None:
    """docs/approvals.md: each vote is in the audit; docs/security.md: every audit entry is chained, so a vote
    must be too, or `qbroker audit verify` reports the quorum's own entries as slipped in."""
    from broker.audit import verify
    from broker.signing import TrustedKeys
    from tests.helpers import SIGNING_KEY

    broker = await make_broker()
    async with broker.provider("web") as provider:
        asked = asyncio.create_task(broker.ask(deploy(), timeout=20))
        card = await next_pending(provider)
        await policies.vote(card, pick("yes"), by="alice")
        await policies.vote(card, pick("yes"), by="bob")
        assert await asked == pick("yes")
    trail = await audit(broker)
    assert [e["event"] for e in trail if e["event"] == "vote"] == ["vote", "vote"]
    assert all(e.get("chain") for e in trail), trail
    report = await verify(broker.commands, broker.keys, TrustedKeys([SIGNING_KEY.public_text]))
    assert report.status == "intact", report.findings
