"""A read-only snapshot of one namespace: who provides, what waits, who may ask."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec

from ._keys import Keys

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["AgentInfo", "NamespaceStatus", "PendingInfo", "namespace_status"]

_PAGE = 500


class PendingInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A request waiting for an answer."""

    request_id: str
    agent: str | None
    age_s: float
    """seconds since it was asked, by the Redis clock"""
    questions: int
    delivered_epoch: int | None = None
    """the lease epoch under which a provider took it, if one did"""
    key: str | None = None
    """the key of a keyed ask (``ask(..., key=)``)"""
    away_s: float | None = None
    """for a keyed ask whose asker stopped: seconds since; it can still be answered"""
    grace_left_s: float | None = None
    """for an away asker: seconds left to re-attach before the request ends as expired"""
    priority: str = "normal"
    """the request's priority: urgent, normal or low"""


class AgentInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A live agent instance (its token never leaves Redis; it is not shown)."""

    agent_id: str
    owner: str | None
    since: int
    """unix seconds of its registration"""


class NamespaceStatus(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    holder: str | None
    """the name of the provider holding the lease, None when nobody does"""
    epoch: int | None
    lease_ttl_s: float | None
    """seconds left on the lease"""
    standbys: tuple[str, ...]
    pending: tuple[PendingInfo, ...]
    agents: tuple[AgentInfo, ...]
    stream_length: int
    dead_letters: int
    last_epoch: int = 0
    """the epoch counter: how many times the lease was taken"""


async def namespace_status(broker: Broker) -> NamespaceStatus:
    """Read the namespace's state; writes nothing. Pending requests are read from the stream."""
    call = broker.commands.call
    keys: Keys = broker.keys
    seconds, micros = await call("TIME")
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    lease, pttl, last_epoch, standbys, stream_length, dead_letters = await asyncio.gather(
        call("GET", keys.provider),
        call("PTTL", keys.provider),
        call("GET", keys.epoch),
        call("ZRANGEBYSCORE", keys.standbys, now_ms, "+inf"),
        call("XLEN", keys.requests),
        call("XLEN", keys.dead),
    )
    holder = epoch = None
    holder_member = ""
    if lease:
        epoch_text, token, holder = str(lease).split(":", 2)
        epoch = int(epoch_text)
        holder_member = f"{token}:{holder}"  # the holder registers beside the standbys
    return NamespaceStatus(
        namespace=keys.namespace,
        holder=holder,
        epoch=epoch,
        lease_ttl_s=int(pttl) / 1000 if lease and int(pttl) >= 0 else None,
        standbys=tuple(str(member).split(":", 1)[-1] for member in standbys if member != holder_member),
        pending=await _pending(call, keys, now_ms),
        agents=await _agents(call, keys, now_ms),
        stream_length=int(stream_length),
        dead_letters=int(dead_letters),
        last_epoch=int(last_epoch or 0),
    )


async def _pending(call: Any, keys: Keys, now_ms: int) -> tuple[PendingInfo, ...]:
    found: list[PendingInfo] = []
    start = "-"
    while True:
        entries = await call("XRANGE", keys.requests, start, "+", "COUNT", _PAGE)
        stream_fields = [_pairs(flat) for _id, flat in entries]
        asks = [fields["rid"] for fields in stream_fields if fields.get("kind") == "ask" and fields.get("rid")]
        records = await asyncio.gather(
            *(
                call("HMGET", keys.request(rid), "state", "agent", "created", "delivered", "request", "key", "away")
                for rid in asks
            ),
            *(call("ZSCORE", keys.away, rid) for rid in asks),
        )  # issued together: one round trip
        records, graces = records[: len(asks)], records[len(asks) :]
        for request_id, record, grace_ends in zip(asks, records, graces, strict=True):
            state, agent, created, delivered, request, key, away = record
            if state != "pending":
                continue
            try:
                body = msgspec.json.decode(request or "{}")
                questions, priority = len(body.get("questions", ())), str(body.get("priority", "normal"))
            except (msgspec.DecodeError, AttributeError, TypeError):
                questions, priority = 0, "normal"
            found.append(
                PendingInfo(
                    request_id=request_id,
                    agent=agent or None,
                    age_s=max(0, now_ms - int(created or now_ms)) / 1000,
                    questions=questions,
                    delivered_epoch=int(delivered) if delivered else None,
                    key=key or None,
                    away_s=max(0, now_ms - int(away)) / 1000 if away else None,
                    grace_left_s=max(0, float(grace_ends) - now_ms) / 1000 if away and grace_ends else None,
                    priority=priority,
                )
            )
        if len(entries) < _PAGE:
            return tuple(found)
        start = "(" + entries[-1][0]


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))


async def _agents(call: Any, keys: Keys, now_ms: int) -> tuple[AgentInfo, ...]:
    """The live agents, from the agents index (no SCAN: an ACL user fenced to its namespace may not)."""
    names = await call("ZRANGEBYSCORE", keys.agents, now_ms, "+inf")
    records = await asyncio.gather(*(call("HMGET", keys.agent(name), "owner", "since") for name in names))
    found = [
        AgentInfo(agent_id=name, owner=owner or None, since=int(since))
        for name, (owner, since) in zip(names, records, strict=True)
        if since is not None  # expired since the index was last refreshed
    ]
    return tuple(sorted(found, key=lambda agent: agent.agent_id))
