"""The page's remembered decisions: answer with "remember", list them, revoke one.

An answer body may carry ``remember: {scope: "agent" | "namespace", ttl?: seconds}``; the web
user is who set the decision (its ``by``), this server its provider. The list covers every
namespace the person may answer in.
"""

from __future__ import annotations

from typing import Any

import msgspec

from broker import Reads, Remember, UserQuestionError
from broker.errors import BAD_REQUEST
from workers.answering.web.service import WebProvider
from workers.inert import inert

__all__ = ["DEFAULT_TTL", "list_remembered", "parse_remember", "revoke_remembered"]

DEFAULT_TTL = 3600.0


def parse_remember(body: Any) -> Remember | None:
    """The ``remember`` of an answer body (None when absent or false); ``BAD_REQUEST`` when malformed."""
    given = body.get("remember") if isinstance(body, dict) else None
    if given is None or given is False:
        return None
    if not isinstance(given, dict) or given.get("scope") not in ("agent", "namespace"):
        raise UserQuestionError("remember is {scope: 'agent' | 'namespace', ttl?: seconds}", BAD_REQUEST)
    ttl = given.get("ttl", DEFAULT_TTL)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise UserQuestionError("remember.ttl is a number of seconds", BAD_REQUEST)
    return Remember(scope=given["scope"], ttl=float(ttl))


async def list_remembered(services: list[WebProvider]) -> dict[str, Any]:
    """Every live decision of these namespaces, newest first, with the Redis clock for expiry."""
    decisions: list[dict[str, Any]] = []
    now_ms = 0
    for service in services:
        broker = service.broker
        for decision in await broker.decisions():
            listed = msgspec.to_builtins(decision)
            for name in ("question", "header", "agent"):  # asker text, as a page shows it
                if isinstance(listed.get(name), str):
                    listed[name] = inert(listed[name])
            listed["selected"] = [inert(label) for label in listed.get("selected") or ()]
            decisions.append({**listed, "namespace": broker.namespace})
        now_ms = await Reads(broker).server_time_ms()
    decisions.sort(key=lambda d: d["atMs"], reverse=True)
    return {"nowMs": now_ms, "decisions": decisions}


async def revoke_remembered(services: list[WebProvider], decision_id: str, *, by: str, namespace: Any) -> bool:
    """Revoke in the named namespace (or the first of these that has it); False when none has it."""
    for service in services:
        if namespace is not None and service.broker.namespace != namespace:
            continue
        if await service.broker.revoke_decision(decision_id, by=by):
            return True
    return False
