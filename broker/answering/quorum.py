"""Approvals that need more than one person: quorum policies, kept on the answering side.

A policy file (TOML, docs/approvals.md) says which questions need what: it matches by agent,
header, intent, priority or question text, and requires ``approvals`` votes from distinct people,
optionally members of named ``groups`` (``[groups]`` in the users file). The request never says
so: an agent must not choose its own threshold.

Each person's vote is one settle-shaped act (an answer, or a dismissal) recorded by
``approve.lua`` in ``qb:{ns}:approvals:<rid>``, a hash only the answering side may write
(broker/roles.py), under the lease's fence: a standby that takes over finds the votes so far.
The card settles only when ``approvals`` people gave the same approving answer (its ``by``
names every one of them, in the order they voted, so the sealed outcome and the audit carry
them); one declining vote settles it at once (``decline = "any"``, the default) or counts
towards a quorum of its own (``decline = "quorum"``).

What approves: a plan review's ``approve`` label, or one of the policy's ``approve`` labels;
an answer that picks another option, free text or a dismissal declines. A question with no
notion of approving (no intent, no ``approve`` labels among its options) takes any answer,
and the quorum is that many people giving the same one.

A covered card cannot be remembered (``remember`` is refused with ``BAD_ANSWER``), and
``revoke_covered`` forgets every live decision a policy might cover, so that no lookup
answers such a question without its quorum.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..decisions import Remember
from ..errors import BAD_ANSWER, NOT_APPROVER, UserQuestionError
from ..types import PRIORITIES, AskUserQuestionAnswer, AskUserQuestionRequest, PlanReviewIntent
from ..validation import check_answer
from .cards import PendingRequest
from .policy import Policy, PolicyError

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["Policies", "Policy", "PolicyError", "Tally", "Vote", "load_groups", "load_policies", "revoke_covered"]

_KNOWN = {"name", "match", "approvals", "groups", "decline", "route", "approve", "escalate"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_MATCHERS = {"agent", "header", "intent", "priority", "text"}
_AT = "#at:"
"""approve.lua keeps when each person voted under this prefix"""


@dataclass(frozen=True)
class Policies:
    """The policies of a namespace's answering side (the first that matches a card applies) and the groups."""

    policies: tuple[Policy, ...] = ()
    groups: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.policies)

    def for_card(self, pending: PendingRequest) -> Policy | None:
        if not self.policies:  # no policy: nothing to read off the card (a failover asks 100 000 times)
            return None
        return self.for_request(pending.request, pending.priority, [asker.agent_id for asker in pending.askers])

    def for_request(
        self, request: AskUserQuestionRequest, priority: str, agents: Sequence[str | None]
    ) -> Policy | None:
        """The policy of a card of ``request`` asked at ``priority`` by ``agents``: the first that covers it
        (a standby lists the holder's cards by their requests alone: it has no card)."""
        return next((p for p in self.policies if p.covers(request, priority, agents)), None)

    def voters(self, policy: Policy, escalated: bool = False) -> frozenset[str] | None:
        """Who may vote under ``policy`` (with the escalation group once ``escalated``); ``None``: anyone."""
        if not policy.groups:
            return None
        groups = (*policy.groups, policy.escalate_to) if escalated and policy.escalate_to else policy.groups
        return frozenset(person for group in groups for person in self.groups.get(group, ()))

    def may_vote(self, policy: Policy, person: str, escalated: bool = False) -> bool:
        voters = self.voters(policy, escalated)
        return voters is None or person in voters

    def routed_to(self, policy: Policy, escalated: bool = False) -> tuple[str, ...]:
        """The groups a routed card is for (the escalation group joins once ``escalated``); empty: everyone."""
        if not policy.route:
            return ()
        return (policy.route, policy.escalate_to) if escalated and policy.escalate_to else (policy.route,)

    def recorded_route(self, policy: Policy | None, escalated: bool = False) -> tuple[str, ...] | None:
        """What a settlement records as a card's route in the audit (``route``; a history routes by it): the groups
        it is routed to, empty for none; ``None`` (no field) when no policy here routes: every card is everyone's."""
        if not any(p.route for p in self.policies):
            return None
        return () if policy is None else self.routed_to(policy, escalated)

    def may_see(self, pending: PendingRequest, person: str) -> bool:
        """Routing: a card routed to a group is for its members only (and, once escalated, the escalation group's)."""
        policy = self.for_card(pending)
        if policy is None:
            return True
        routes = self.routed_to(policy, policy.escalated(pending))
        return not routes or any(person in self.groups.get(group, frozenset()) for group in routes)

    async def vote(
        self,
        pending: PendingRequest,
        answer: AskUserQuestionAnswer | None,
        *,
        by: str,
        message: str = "",
        remember: Remember | None = None,
    ) -> Tally | None:
        """One person's answer (or dismissal, ``answer=None``) on a card: settle it, or count it towards its quorum.

        ``None`` when no policy covers the card (it was settled as usual). Otherwise the tally after
        this vote; the card is settled (answered by every approver, or declined) when it is decided.
        ``NOT_APPROVER`` when ``by`` may not vote; ``BAD_ANSWER`` for an invalid answer or a ``remember``.
        """
        policy = self.for_card(pending)
        if policy is None:
            route = self.recorded_route(None)
            if answer is None:
                await pending.cancel(message or "the human dismissed the question", by=by, route=route)
            else:
                await pending.answer(answer, by=by, remember=remember, route=route)
            return None
        settler = pending.settler
        escalated = policy.escalated(pending)
        if not self.may_vote(policy, by, escalated) or not self.may_see(pending, by):
            groups = self.routed_to(policy, escalated) if policy.route else policy.groups
            if escalated and policy.escalate_to and policy.escalate_to not in groups:
                groups = (*groups, policy.escalate_to)
            raise UserQuestionError(
                f"{by} is not an approver under policy {policy.name!r} (members of {', '.join(groups)})",
                NOT_APPROVER,
            )
        if remember is not None:
            raise UserQuestionError(
                f"policy {policy.name!r} needs {policy.approvals} approvals: its answers are never remembered",
                BAD_ANSWER,
            )
        accepted = None if answer is None else check_answer(pending.request, answer, settler.settings.limits)
        record = _VoteRecord(
            approving=approving(policy, pending.request, accepted),
            answer=accepted,
            message=message,
        )
        votes = await settler.record_vote(
            pending.request_id,
            person=by,
            vote=msgspec.json.encode(record).decode(),
            policy=policy.name,
            approving=record.approving,
        )
        result = tally(policy, self.voters(policy, escalated), _votes(votes), escalated)
        await settle(pending, result, self.recorded_route(policy, escalated))
        return result

    async def current(self, pending: PendingRequest) -> Tally | None:
        """The votes so far on a card (a standby that took over finds them); settles it if they already decide.

        ``None`` when no policy covers the card.
        """
        policy = self.for_card(pending)
        if policy is None:
            return None
        flat = await pending.settler.votes(pending.request_id)
        escalated = policy.escalated(pending)
        result = tally(policy, self.voters(policy, escalated), _votes(flat), escalated)
        await settle(pending, result, self.recorded_route(policy, escalated))
        return result


@dataclass(frozen=True)
class Vote:
    person: str
    approving: bool
    answer: AskUserQuestionAnswer | None
    """``None``: the person dismissed the question"""
    message: str = ""
    at_ms: int = 0

    @property
    def same_as(self) -> str:
        """What votes must share to count together."""
        if self.answer is None:
            return "cancel"
        return msgspec.json.encode(self.answer).decode()


class _VoteRecord(msgspec.Struct, frozen=True, kw_only=True):
    approving: bool
    answer: AskUserQuestionAnswer | None = None
    message: str = ""


@dataclass(frozen=True)
class Tally:
    """The votes on one card so far, and what they decide."""

    policy: Policy
    votes: tuple[Vote, ...]
    voters: frozenset[str] | None
    decided: Vote | None = None
    """the vote whose answer (or dismissal) settles the card, once it is decided"""
    by: tuple[str, ...] = ()
    """everyone whose vote decided it, in the order they voted"""
    escalated: bool = False
    """the escalation group may answer too"""

    @property
    def counted(self) -> tuple[Vote, ...]:
        """The votes that count, in order: ``votes`` less those of people who may no longer vote."""
        return _counted(self.votes, self.voters)

    @property
    def approved_by(self) -> tuple[str, ...]:
        return tuple(vote.person for vote in self.counted if vote.approving)

    @property
    def declined_by(self) -> tuple[str, ...]:
        return tuple(vote.person for vote in self.counted if not vote.approving)

    @property
    def may_still(self) -> tuple[str, ...] | None:
        """Who may still vote (``None``: anyone who may answer and has not)."""
        if self.voters is None:
            return None
        voted = {vote.person for vote in self.votes}
        return tuple(sorted(self.voters - voted))

    def view(self) -> dict[str, Any]:
        """What a page shows: the policy, how many approvals it needs, who voted and who may still."""
        policy = self.policy
        return {
            "policy": policy.name,
            "needed": policy.approvals,
            "groups": list(policy.groups),
            "decline": policy.decline,
            "approvedBy": list(self.approved_by),
            "declinedBy": list(self.declined_by),
            "mayStill": None if self.may_still is None else list(self.may_still),
            "decided": self.decided is not None,
            "escalatesTo": policy.escalate_to or None,
            "escalated": self.escalated,
        }


def tally(policy: Policy, voters: frozenset[str] | None, votes: Iterable[Vote], escalated: bool = False) -> Tally:
    """What the votes decide: ``policy.approvals`` identical approving votes, or a decline."""
    ordered = tuple(sorted(votes, key=lambda vote: (vote.at_ms, vote.person)))
    same: dict[str, list[Vote]] = {}
    for vote in _counted(ordered, voters):
        if not vote.approving and policy.decline == "any":
            return Tally(policy, ordered, voters, vote, (vote.person,), escalated)
        same.setdefault(vote.same_as, []).append(vote)
        if len(same[vote.same_as]) >= policy.approvals:
            group = same[vote.same_as]
            return Tally(policy, ordered, voters, group[0], tuple(v.person for v in group), escalated)
    return Tally(policy, ordered, voters, escalated=escalated)


def _counted(votes: tuple[Vote, ...], voters: frozenset[str] | None) -> tuple[Vote, ...]:
    # A stored vote stays in Redis after its person leaves the policy's groups (the users file changed): it is
    # judged by who may vote now, so it neither counts towards the quorum nor shows as an approval.
    return tuple(vote for vote in votes if voters is None or vote.person in voters)


def approving(policy: Policy, request: AskUserQuestionRequest, answer: AskUserQuestionAnswer | None) -> bool:
    """Whether ``answer`` approves: every question with a notion of approving picks an approving label."""
    if answer is None:
        return False
    given = {item.id: item for item in answer.answers}
    for question in request.questions:
        approve = set(policy.approve) & set(question.labels)
        if isinstance(question.intent, PlanReviewIntent):
            approve = {question.intent.approve}
        if not approve:
            continue
        item = given.get(question.id)
        if item is None or item.custom is not None or not item.selected or not set(item.selected) <= approve:
            return False
    return True


async def settle(pending: PendingRequest, result: Tally, route: Sequence[str] | None) -> None:
    """Settle a decided card: its answer by every approver, or the decline (a no-op while undecided); ``route``
    goes into the audit (``Policies.recorded_route``)."""
    decided = result.decided
    if decided is None:
        return
    by = ", ".join(result.by)
    if decided.answer is None:
        await pending.cancel(decided.message or f"{by} dismissed the question", by=by, route=route)
    else:
        await pending.answer(decided.answer, by=by, route=route)


def _votes(flat: Any) -> list[Vote]:
    fields = dict(flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=True))
    votes = []
    for person, raw in fields.items():
        if person.startswith(_AT):
            continue
        try:
            record = msgspec.json.decode(raw, type=_VoteRecord)
            at_ms = int(fields.get(_AT + person, 0))
        except (msgspec.DecodeError, ValueError):
            continue
        votes.append(Vote(str(person), record.approving, record.answer, record.message, at_ms))
    return votes


async def revoke_covered(policies: Policies, broker: Broker, *, by: str = "quorum policy") -> list[str]:
    """Forget every live remembered decision a policy might cover; the ids forgotten.

    Run by a provider with policies when it takes the lease, so that no decision remembered
    before (or by a provider without the policy) answers a covered question without its quorum.
    """
    forgotten = []
    for decision in await broker.decisions():
        policy = next((p for p in policies.policies if p.may_cover(decision)), None)
        if policy is not None and await broker.revoke_decision(decision.id, by=f"{by} {policy.name!r}"):
            forgotten.append(decision.id)
    return forgotten


def load_groups(data: Mapping[str, Any], source: str = "users file") -> dict[str, frozenset[str]]:
    """``[groups]`` of a users file: group name -> its members' names."""
    table = data.get("groups", {})
    if not isinstance(table, dict) or not all(
        isinstance(members, list) and all(isinstance(m, str) for m in members) for members in table.values()
    ):
        raise PolicyError(f"{source}: [groups] maps group names to lists of user names")
    return {name: frozenset(members) for name, members in table.items()}


def load_policies(path: Path | None, *, groups: Mapping[str, frozenset[str]] | None = None) -> Policies:
    """Read a policy file (``[[policy]]`` tables, docs/approvals.md); ``groups`` from the users file.

    A ``[groups]`` table in the policy file itself adds to them (for a provider without a users file).
    """
    if path is None:
        return Policies((), dict(groups or {}))
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise PolicyError(f"cannot read policy file {path}: {error}") from error
    known = {**(groups or {}), **load_groups(data, str(path))}
    tables = data.get("policy", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise PolicyError(f"{path}: policies are [[policy]] tables")
    policies = tuple(_policy(table, i, path, known) for i, table in enumerate(tables, 1))
    return Policies(policies, known)


def _policy(table: dict[str, Any], number: int, path: Path, groups: Mapping[str, frozenset[str]]) -> Policy:
    where = f"{path}: policy {table.get('name', number)!r}"
    if unknown := set(table) - _KNOWN:
        raise PolicyError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    match = table.get("match", {})
    if not isinstance(match, dict) or (unknown := set(match) - _MATCHERS):
        raise PolicyError(f"{where}: match takes {', '.join(sorted(_MATCHERS))}")
    approvals = table.get("approvals", 1)
    if not isinstance(approvals, int) or isinstance(approvals, bool) or approvals < 1:
        raise PolicyError(f"{where}: approvals is a whole number of at least 1")
    decline = table.get("decline", "any")
    if decline not in ("any", "quorum"):
        raise PolicyError(f"{where}: decline is 'any' (one decline decides) or 'quorum'")
    named = _strings(table.get("groups", []), f"{where}: groups")
    route = table.get("route", "")
    if not isinstance(route, str):
        raise PolicyError(f"{where}: route names one group")
    after, escalate_to = _escalation(table.get("escalate"), where)
    if escalate_to and not (named or route):
        raise PolicyError(f"{where}: escalate widens route or groups; this policy has neither")
    for group in (*named, *([route] if route else []), *([escalate_to] if escalate_to else [])):
        if group not in groups:
            raise PolicyError(f"{where}: no group {group!r} ([groups] in the users file)")
    voters = {person for group in named for person in groups[group]}
    if named and len(voters) < approvals:
        raise PolicyError(f"{where}: needs {approvals} approvals but its groups have {len(voters)} members")
    priority = _strings(match.get("priority", []), f"{where}: match.priority")
    if bad := set(priority) - set(PRIORITIES):
        raise PolicyError(f"{where}: unknown priority {', '.join(sorted(bad))}")
    text = match.get("text", "")
    try:
        re.compile(text)
    except (re.error, TypeError) as error:
        raise PolicyError(f"{where}: match.text is a regular expression: {error}") from error
    return Policy(
        name=str(table.get("name", f"policy {number}")),
        approvals=approvals,
        groups=named,
        decline=decline,
        route=route,
        approve=_strings(table.get("approve", []), f"{where}: approve"),
        escalate_after=after,
        escalate_to=escalate_to,
        agent=_strings(match.get("agent", []), f"{where}: match.agent"),
        header=_strings(match.get("header", []), f"{where}: match.header"),
        intent=_strings(match.get("intent", []), f"{where}: match.intent"),
        priority=priority,
        text=text,
    )


def _escalation(value: Any, where: str) -> tuple[float, str]:
    """``escalate = {after = "10m", to = "leads"}``: (seconds, group); ``(0, "")`` without one."""
    if value is None:
        return 0.0, ""
    if not isinstance(value, dict) or set(value) != {"after", "to"} or not isinstance(value["to"], str):
        raise PolicyError(f'{where}: escalate is {{after = "10m", to = "group"}}')
    after = value["after"]
    if isinstance(after, (int, float)) and not isinstance(after, bool) and after >= 0:
        return float(after), value["to"]
    found = _DURATION.fullmatch(after.strip()) if isinstance(after, str) else None
    if found is None:
        raise PolicyError(f'{where}: escalate.after is a delay: seconds, or "500ms", "30s", "10m", "2h"')
    return float(found[1]) * _UNIT[found[2] or "s"], value["to"]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{where} is a string or a list of strings")
    return tuple(value)
