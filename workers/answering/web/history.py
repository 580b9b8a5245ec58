"""Recently settled requests, read from the namespace's audit stream and askers' log (read-only).

Who answered what and when: the terminal events (answered, cancelled, withdrawn, expired,
dead-lettered), newest first, of the audit and its human record (the answering side's and
housekeeping's: a human's answer, a cancel, a reap; ``broker.audit.newest``) and of the askers' log
(what askers say they did: a withdrawal, an answer by a remembered decision), each entry saying which
(``source``: ``audit`` or ``asker``). What was asked comes from the requests this server showed
(``known``: the whole text), else from the audit entry itself (its ``asked`` field: the agent, each
question's text and a plan's approve label, whatever process answered and however long ago), else,
while it still exists, the request hash; an entry that has none of them shows question ids only.

History is routed like the live page (``seen_by``, docs/approvals.md): each entry carries the groups its card was
routed to, as the answering side recorded them at settlement (the audit's ``route``; an askers' log entry's is not
trusted), else as this server routed the card while showing it, else none known (an older entry, or one settled by
a provider that does not route): shown whole then only to those who see every card.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from broker import Broker, Reads
from workers.inert import inert

__all__ = ["TERMINAL", "find_settlement", "outcome_json", "read_history", "seen_by"]

TERMINAL = frozenset({"answered", "cancelled", "withdrawn", "expired", "dead-lettered"})
_SEARCH_DEPTH = 2_000
"""audit events searched for one request's settlement (newest first)"""
_SCAN_FACTOR = 6
"""audit events read per history entry wanted (asks and deliveries sit between settlements), at first"""
READ_BOUND = 4_000
"""events (of the audit, its human record and the askers' log, together) one history request reads per namespace at
most, reading on past the entries routed away from its person: a namespace whose audit (10 000 by default) is all
another group's cards does not make each request read all of it (docs/approvals.md)"""


async def _newest(broker: Broker, count: int, before: dict[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
    """The newest ``count`` events of the audit and the askers' log together, newest first; ``before``: by
    ``_source``, the oldest entry id read so far of each (the next page is older).

    Entry ids of one Redis server order across streams; each event's fields gain ``_source``.
    """
    reads = Reads(broker)
    before = before or {}
    audited, asklog = await asyncio.gather(
        reads.newest_audit(count, before=before.get("audit")), reads.newest_asker_log(count, before=before.get("asker"))
    )
    merged = [(entry_id, {**fields, "_source": "audit"}) for entry_id, fields in audited]
    merged += [(entry_id, {**fields, "_source": "asker"}) for entry_id, fields in asklog]
    merged.sort(key=_when, reverse=True)
    return merged[:count]


def _when(entry: tuple[str, dict[str, str]]) -> tuple[int, int, int]:
    """Order across the two streams: each counts its own sequence within a millisecond, so within one
    the askers' events (an ask, a withdrawal) come before the audit's (what answered them)."""
    ms, seq = (int(part) for part in entry[0].split("-", 1))
    return ms, 0 if entry[1]["_source"] == "asker" else 1, seq


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def outcome_json(text: str | None) -> dict[str, Any]:
    """An outcome's JSON object, a sealed one unwrapped (``{"signed": <outcome JSON>, "proof": ...}``);
    ``{}`` when it does not parse. For showing only: askers verify the seal, this does not."""
    outcome = _json(text)
    if isinstance(outcome, dict) and isinstance(outcome.get("signed"), str):
        outcome = _json(outcome["signed"])
    return outcome if isinstance(outcome, dict) else {}


def _entry(
    entry_id: str, fields: dict[str, str], request: Any, setters: dict[str, str] | None = None
) -> dict[str, Any]:
    outcome = outcome_json(fields.get("outcome"))
    answers = {}
    if isinstance(outcome.get("answer"), dict):
        answers = {a.get("id"): a for a in outcome["answer"].get("answers", ()) if isinstance(a, dict)}
    message = outcome["error"].get("message") if isinstance(outcome.get("error"), dict) else fields.get("reason")
    questions: list[dict[str, Any]] = []
    asked = request.get("questions", ()) if isinstance(request, dict) else ()
    asked = [item for item in asked if isinstance(item, dict)] if isinstance(asked, list) else []
    if answers and len(asked) == len(answers) and not any(item.get("id") in answers for item in asked):
        # Another asker of a coalesced card: an identical request under its own question ids, in order.
        answers = {item.get("id"): given for item, given in zip(asked, answers.values(), strict=True)}
    for item in asked:
        given = answers.pop(item.get("id"), {})
        question = {
            "id": item.get("id"),
            "question": _shown(item.get("question")),
            "selected": _shown_all(given.get("selected", [])),
            "custom": _shown(given.get("custom")),
            "edited": given.get("edited"),
        }
        approve = _approve_label(item)
        if approve is not None and fields.get("event") == "answered":
            # A plan is approved only by its approve label: a note or the other option declines it.
            question["verdict"] = "approved" if approve in question["selected"] else "declined"
        questions.append(question)
    for qid, given in answers.items():  # the request hash expired: ids and answers only
        questions.append(
            {
                "id": qid,
                "question": None,
                "selected": _shown_all(given.get("selected", [])),
                "custom": _shown(given.get("custom")),
                "edited": given.get("edited"),
            }
        )
    by = fields.get("by") or None
    remembered = bool(by and by.startswith("decision:"))
    if remembered and by is not None:
        # Who set the decisions (from the decision records, which the answering side signs), not their ids.
        who = sorted({setters[d] for d in by.removeprefix("decision:").split(",") if setters and d in setters})
        by = ", ".join(who) or None
    return {
        "id": fields.get("rid", ""),
        "event": fields.get("event", ""),
        "source": fields.get("_source", "audit"),
        "atMs": int(entry_id.split("-", 1)[0]),
        "by": by,
        "remembered": remembered,
        "provider": fields.get("provider") or None,
        "agent": _shown((request.get("agent") if isinstance(request, dict) else None) or fields.get("agent") or None),
        "asker": fields.get("asker") or None,
        "message": _shown(message) if isinstance(message, str) else None,
        "questions": questions,
    }


def _shown(text: Any) -> Any:
    """Asker text as a page shows it (``workers.inert``); anything else as it is."""
    return inert(text) if isinstance(text, str) else text


def _shown_all(texts: Any) -> Any:
    return [_shown(text) for text in texts] if isinstance(texts, list) else texts


Seen = Callable[[dict[str, Any]], dict[str, Any] | None]


def _unrouted(entry: dict[str, Any]) -> dict[str, Any] | None:
    return {name: value for name, value in entry.items() if name != "routes"}


async def read_history(
    broker: Broker,
    *,
    limit: int = 50,
    known: Callable[[str], dict[str, Any] | None] = lambda rid: None,
    seen: Seen = _unrouted,
) -> tuple[list[dict[str, Any]], bool]:
    """The last ``limit`` settlements of the namespace that ``seen`` shows (History's routing for one person:
    ``seen_by``), newest first, as it shows them, and whether ``READ_BOUND`` cut the search short (fewer than
    ``limit`` found, older ones not read). Those it leaves out do not count: it reads on until ``limit`` are shown,
    the streams end, or ``READ_BOUND`` events were read."""
    settled, views, cut_short = await _settled(broker, limit, known, seen)
    # What this server showed (the whole text), else what the audit entry says was asked.
    shown = [view or _json(fields.get("asked")) for view, (_, fields) in zip(views, settled, strict=True)]
    stored = await asyncio.gather(
        *(
            Reads(broker).stored_request(fields.get("rid", ""))
            for (_, fields), view in zip(settled, shown, strict=True)
            if view is None
        )
    )
    fallback = iter(stored)
    requests = [view if view is not None else _json(next(fallback)) for view in shown]
    setters: dict[str, str] = {}
    if any(str(fields.get("by", "")).startswith("decision:") for _, fields in settled):
        decisions = {decision.id: decision for decision in await broker.decisions()}
        setters = {decision_id: decision.by for decision_id, decision in decisions.items()}
        for i, (_, fields) in enumerate(settled):
            if requests[i] is None and str(fields.get("by", "")).startswith("decision:"):
                requests[i] = _decided_request(fields, decisions)
    entries = (
        seen({**_entry(entry_id, fields, request, setters), "routes": _routes(fields, view)})
        for (entry_id, fields), request, view in zip(settled, requests, views, strict=True)
    )
    return [entry for entry in entries if entry is not None], cut_short


async def _settled(
    broker: Broker, limit: int, known: Callable[[str], dict[str, Any] | None], seen: Seen
) -> tuple[list[tuple[str, dict[str, str]]], list[dict[str, Any] | None], bool]:
    """The newest ``limit`` settlements ``seen`` shows, and this server's view of each (``known``), judged by their
    route alone (before anything else is read for them), at most ``READ_BOUND`` events read: a page at a time, each
    twice the last, older than the oldest entry read of each stream."""
    settled: list[tuple[str, dict[str, str]]] = []
    views: list[dict[str, Any] | None] = []
    before: dict[str, str] = {}
    count, read = limit * _SCAN_FACTOR, 0
    while read < READ_BOUND:
        count = min(count, READ_BOUND - read)
        raw = await _newest(broker, count, before)
        read += len(raw)
        for entry_id, fields in raw:
            before[fields["_source"]] = entry_id
            if fields.get("event") not in TERMINAL:
                continue
            view = known(fields.get("rid", ""))
            if seen({"routes": _routes(fields, view)}) is not None:  # the rule the entry is shown by, on its route
                settled.append((entry_id, fields))
                views.append(view)
                if len(settled) == limit:
                    return settled, views, False
        if len(raw) < count:  # every stream read to its start
            return settled, views, False
        count *= 2
    return settled, views, True


def _routes(fields: dict[str, str], view: dict[str, Any] | None) -> list[str] | None:
    """The groups a settled card was routed to (empty: to nobody); ``None``: not known. The audit's ``route`` is
    written by the answering side only (settle.lua); the askers' log is an asker's to write, so its is ignored."""
    if fields.get("_source") == "audit":
        recorded = _json(fields.get("route"))
        if isinstance(recorded, list) and all(isinstance(group, str) for group in recorded):
            return recorded
    if view is not None:  # this server routed it while showing it (a view's ``routes``: None when routed to nobody)
        routes = view.get("routes")
        return [group for group in routes if isinstance(group, str)] if isinstance(routes, list) else []
    return None


_NOT_SHOWN = {"hidden": True, "agent": None, "asker": None, "by": None, "remembered": False, "message": None}


def seen_by(
    entry: dict[str, Any], user: str, may_see: Callable[[dict[str, Any], str], bool], sees_every_card: bool
) -> dict[str, Any] | None:
    """What ``user`` is shown of a history entry (its ``routes`` taken out), by the live page's rule (``may_see``):
    nothing of a card routed to groups they are not in; of one whose route is not known, everything only if they
    see every card (``sees_every_card``), else that something settled, not what, who asked or who answered."""
    routes = entry.pop("routes", None)
    if routes is None:
        return entry if sees_every_card else {**entry, **_NOT_SHOWN, "questions": []}
    return entry if may_see({"routes": routes}, user) else None


def _decided_request(fields: dict[str, str], decisions: dict[str, Any]) -> dict[str, Any]:
    """What an ask answered by remembered decisions asked, as far as the decisions tell (one per question)."""
    ids = fields.get("by", "").removeprefix("decision:").split(",")
    outcome = outcome_json(fields.get("outcome"))
    answered = outcome["answer"].get("answers", []) if isinstance(outcome.get("answer"), dict) else []
    questions = []
    for decision_id, given in zip(ids, answered, strict=False):
        decision = decisions.get(decision_id)
        if isinstance(given, dict):
            questions.append({"id": given.get("id"), "question": decision.question if decision else None})
    return {"agent": fields.get("agent") or None, "questions": questions}


def _approve_label(item: dict[str, Any]) -> str | None:
    """A plan review's approve label, from a shown view (``approve``) or a stored request (its intent)."""
    if isinstance(item.get("approve"), str):
        return str(item["approve"])
    intent = item.get("intent")
    if isinstance(intent, dict) and intent.get("kind") == "plan-review" and isinstance(intent.get("approve"), str):
        return str(intent["approve"])
    return None


async def find_settlement(broker: Broker, request_id: str) -> tuple[str, str, Any, list[str] | None] | None:
    """``(event, by, answer, routes)`` of a request's settlement among the recent audit events, if there."""
    for _entry_id, fields in await _newest(broker, _SEARCH_DEPTH):
        if fields.get("rid") == request_id and fields.get("event") in TERMINAL:
            answer = outcome_json(fields.get("outcome")).get("answer")
            return str(fields["event"]), fields.get("by") or "", answer, _routes(fields, None)
    return None
