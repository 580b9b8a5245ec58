"""Remembered decisions: a team answers a question once for a whole namespace (or one agent).

A provider answers with ``remember=Remember(scope=..., ttl=...)``; ``settle.lua`` stores one
decision per question, under the question's fingerprint, atomically with the settlement and
under the same fence. A later ask whose every question has a live decision in scope is
answered by ``ask.lua`` at once, with the new request's ids, without reaching a human.

The fingerprint is what makes two questions "the same": SHA-256 (hex) of the compact JSON
array ``[question, header, [option labels...], multiSelect, intent kind]`` (``null`` for an
absent header or intent), written as msgspec (and JavaScript's ``JSON.stringify``) writes it:
no whitespace, UTF-8, non-ASCII unescaped. Ids, ``detail`` and option descriptions are left
out (docs/protocol.md, Remembered decisions).

Only an answer that is valid for a later identical question is remembered: every item picks
at least one option label and carries no free ``custom`` text (a skip or an "Other" text is a
one-off), no question has an intent (a plan review's plan is its ``detail``, outside the
fingerprint), and the asker did not opt out (``ask(..., remember=False)``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from ._commands import Commands
from ._keys import Keys
from ._scripts import decision_revoke
from .errors import BAD_ANSWER, BAD_REQUEST, UserQuestionError
from .signing import SigningKey, TrustedKeys, decision_message
from .types import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionItem, AskUserQuestionRequest, encode

__all__ = [
    "MAX_REMEMBER_TTL",
    "Decision",
    "Remember",
    "decision_keys",
    "decision_setters",
    "list_decisions",
    "question_fingerprint",
    "revoke_decision",
    "why_not_rememberable",
]

Scope = Literal["agent", "namespace"]
MAX_REMEMBER_TTL = 366 * 86_400.0
"""the longest a decision may be remembered, seconds"""


@dataclass(frozen=True)
class Remember:
    """Remember an answer for later identical questions: of this agent, or of the whole namespace."""

    scope: Scope = "namespace"
    ttl: float = 3600.0
    """seconds the decision lives (judged by the Redis clock)"""

    def __post_init__(self) -> None:
        if self.scope not in ("agent", "namespace"):
            raise UserQuestionError(f"remember scope must be 'agent' or 'namespace', not {self.scope!r}", BAD_REQUEST)
        if not isinstance(self.ttl, int | float) or not 1 <= self.ttl <= MAX_REMEMBER_TTL:
            raise UserQuestionError(
                f"remember ttl must be 1 to {MAX_REMEMBER_TTL:.0f} seconds, not {self.ttl!r}", BAD_REQUEST
            )


class Decision(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A live remembered decision, as listed."""

    id: str
    scope: str
    agent: str | None
    fingerprint: str
    question: str
    header: str | None
    selected: tuple[str, ...]
    by: str
    """who decided (the ``by`` of the answer: the web user, say)"""
    provider: str
    """the provider that settled it"""
    request_id: str
    at_ms: int
    expires_ms: int


def question_fingerprint(item: AskUserQuestionItem) -> str:
    """SHA-256 hex of ``[question, header, [labels...], multiSelect, intent kind]`` (compact JSON)."""
    kind = item.intent.kind if item.intent is not None else None
    canonical = encode([item.question, item.header, item.labels, item.multi_select, kind])
    return hashlib.sha256(canonical).hexdigest()


def decision_keys(keys: Keys, request: AskUserQuestionRequest) -> list[str]:
    """ask.lua's lookup keys: per question, the agent's decision key (else the namespace's), the namespace's.

    None for a request with an intent question: no decision answers a plan review.
    """
    if any(item.intent is not None for item in request.questions):
        return []
    found: list[str] = []
    for item in request.questions:
        fp = question_fingerprint(item)
        namespace_key = keys.decision(fp)
        found += [keys.decision(fp, request.agent) if request.agent else namespace_key, namespace_key]
    return found


def why_not_rememberable(
    request: AskUserQuestionRequest, answer: AskUserQuestionAnswer, remember: Remember, *, opted_out: bool
) -> str | None:
    """Why this answer cannot be remembered, or None when it can."""
    if opted_out:
        return "the asker asked for a human every time (remember=False)"
    if remember.scope == "agent" and not request.agent:
        return "the request has no agent: remember it for the namespace instead"
    for question in request.questions:
        if question.intent is not None:
            return (
                f"question {question.id!r} has an intent ({question.intent.kind}): its detail (a plan) is not part "
                "of the fingerprint, so approving one must never approve another"
            )
    for item in answer.answers:
        if item.custom is not None:
            return f"question {item.id!r} has free text (custom): only chosen options are remembered"
        if not item.selected:
            return f"question {item.id!r} is skipped: only chosen options are remembered"
        if item.edited is not None:
            return f"question {item.id!r} has edited arguments: an edit is for this call only"
    return None


class DecisionProof(msgspec.Struct, frozen=True, kw_only=True):
    """A decision's signature and everything it covers besides the decision id and selected labels."""

    key: str
    sig: str
    scope: str
    agent: str
    fingerprint: str
    expires: int
    """unix ms by the Redis clock"""
    by: str


_proof_decoder = msgspec.json.Decoder(DecisionProof)


def settle_extension(
    keys: Keys,
    request: AskUserQuestionRequest,
    answer: AskUserQuestionAnswer,
    remember: Remember | None,
    *,
    signing_key: SigningKey,
    now_ms: int,
    by: str,
) -> tuple[list[str], list[Any]]:
    """The decision keys and arguments settle.lua takes after a settlement's own (``D`` first).

    Each decision is signed, with its expiry counted from ``now_ms`` (the Redis clock).
    """
    if remember is None:
        return [], [0]
    ttl_ms = int(remember.ttl * 1000)
    agent = request.agent if remember.scope == "agent" else None
    script_keys: list[str] = []
    args: list[Any] = [len(answer.answers)]
    by_id = {item.id: item for item in request.questions}
    for given in answer.answers:
        item = by_id[given.id]
        fp = question_fingerprint(item)
        script_keys.append(keys.decision(fp, agent))
        summary = {
            "scope": remember.scope,
            "agent": agent,
            "fingerprint": fp,
            "question": item.question,
            "header": item.header,
        }
        decision_id = secrets.token_hex(8)
        expires = now_ms + ttl_ms
        message = decision_message(
            namespace=keys.namespace,
            decision_id=decision_id,
            scope=remember.scope,
            agent=agent or "",
            fingerprint=fp,
            selected=given.selected,
            expires_ms=expires,
            by=by,
        )
        proof = DecisionProof(
            key=signing_key.id,
            sig=signing_key.sign_decision(message),
            scope=remember.scope,
            agent=agent or "",
            fingerprint=fp,
            expires=expires,
            by=by,
        )
        args += [decision_id, ttl_ms, encode(list(given.selected)), encode(summary), encode(proof)]
    return script_keys, args


def decision_setters(records: list[Any]) -> tuple[str, ...]:
    """Who set the decisions of ``records`` (as ask.lua read them; already verified), each once, in order."""
    setters: list[str] = []
    for proof_json in records[2::3]:
        try:
            by = _proof_decoder.decode(proof_json or b"").by
        except msgspec.DecodeError:
            continue
        if by and by not in setters:
            setters.append(by)
    return tuple(setters)


def verified_decisions(
    trusted: TrustedKeys, namespace: str, request: AskUserQuestionRequest, records: list[Any], now_ms: int
) -> AskUserQuestionAnswer | None:
    """The answer the decisions ask.lua found make for ``request``, or None unless every one is genuine.

    ``records`` holds, per question in order, the decision's id, selected labels (JSON) and proof
    (JSON), as ask.lua read them. Genuine: signed by a trusted key for this namespace, for this
    question's fingerprint, in scope (the namespace, or this very agent), not expired by the
    Redis clock, choosing only this question's labels; and no question has an intent.
    """
    if len(records) != 3 * len(request.questions):
        return None
    items: list[AskUserQuestionAnswerItem] = []
    for i, question in enumerate(request.questions):
        decision_id, selected_json, proof_json = records[3 * i : 3 * i + 3]
        try:
            proof = _proof_decoder.decode(proof_json or b"")
            selected = msgspec.json.decode(selected_json or b"", type=tuple[str, ...])
        except msgspec.DecodeError:
            return None
        if question.intent is not None or proof.fingerprint != question_fingerprint(question):
            return None
        if proof.scope == "agent":
            if not request.agent or proof.agent != request.agent:
                return None
        elif proof.scope != "namespace" or proof.agent:
            return None
        if proof.expires <= now_ms:
            return None
        labels = set(question.labels)
        if not selected or not set(selected) <= labels or len(set(selected)) != len(selected):
            return None
        if not question.multi_select and len(selected) != 1:
            return None
        message = decision_message(
            namespace=namespace,
            decision_id=str(decision_id),
            scope=proof.scope,
            agent=proof.agent,
            fingerprint=proof.fingerprint,
            selected=selected,
            expires_ms=proof.expires,
            by=proof.by,
        )
        if not trusted.verify_decision(message, proof.key, proof.sig):
            return None
        items.append(AskUserQuestionAnswerItem(id=question.id, selected=selected))
    return AskUserQuestionAnswer(answers=tuple(items))


def check_remember(
    request: AskUserQuestionRequest, answer: AskUserQuestionAnswer, remember: Remember, *, opted_out: bool
) -> None:
    """Raise ``BAD_ANSWER`` when this answer cannot be remembered (nothing is settled then)."""
    why = why_not_rememberable(request, answer, remember, opted_out=opted_out)
    if why is not None:
        raise UserQuestionError(f"this answer cannot be remembered: {why}", BAD_ANSWER)


async def list_decisions(commands: Commands, keys: Keys) -> list[Decision]:
    """The namespace's live decisions, oldest first (read-only: the index, then each decision)."""
    index: dict[str, str] = _pairs(await commands.call("HGETALL", keys.decisions))
    records = await asyncio.gather(*(commands.call("HGETALL", key) for key in index.values()))
    found: list[Decision] = []
    for (decision_id, _key), raw in zip(index.items(), records, strict=True):
        record = _pairs(raw)
        if record.get("id") != decision_id:
            continue  # expired, or replaced under the same key
        decision = _decision(record)
        if decision is not None:
            found.append(decision)
    return sorted(found, key=lambda d: (d.at_ms, d.id))


async def revoke_decision(commands: Commands, keys: Keys, decision_id: str, *, by: str, audit_maxlen: int) -> bool:
    """Forget a decision; False when there is no such live decision."""
    for _ in range(3):
        key = await commands.call("HGET", keys.decisions, decision_id)
        if key is None:
            return False
        reply = await decision_revoke(
            commands,
            decisions=keys.decisions,
            expiry=keys.decision_expiry,
            audit=keys.audit,
            decision=key,
            id=decision_id,
            by=by,
            audit_max=audit_maxlen,
        )
        if reply.kind != "moved":
            return reply.kind == "ok"
    return False


def _decision(record: dict[str, str]) -> Decision | None:
    try:
        summary = json.loads(record.get("summary") or "{}")
        selected = json.loads(record.get("selected") or "[]")
        return Decision(
            id=record["id"],
            scope=str(summary.get("scope", "namespace")),
            agent=summary.get("agent"),
            fingerprint=str(summary.get("fingerprint", "")),
            question=str(summary.get("question", "")),
            header=summary.get("header"),
            selected=tuple(str(label) for label in selected),
            by=record.get("by", ""),
            provider=record.get("provider", ""),
            request_id=record.get("rid", ""),
            at_ms=int(record.get("at", 0)),
            expires_ms=int(record.get("expires", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # a record written by a foreign worker that does not parse: not listed


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
