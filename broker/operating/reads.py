"""What the answering and operating workers read of a namespace, named by what they mean.

The key layout stays private to the library (``broker._keys``): a worker asks ``Reads`` for a
request's state, an agent's owner or the newest audit entries, and never names a key or a Redis
command. Every read here is read-only, so anyone who may read the namespace may use them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import audit

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["QueuedAsk", "Reads", "Settlement"]


@dataclass(frozen=True)
class QueuedAsk:
    """An ask the provider's stream still holds (delivered or not), with its request hash's fields."""

    request_id: str
    state: str | None
    created_ms: int
    request: str
    """the request's JSON: the stream entry's, else the hash's (empty when neither has it)"""


@dataclass(frozen=True)
class Settlement:
    """A request's hash (``state``, ``by``; None when it is gone) and its outcome JSON (None when read or gone)."""

    state: str | None
    by: str | None
    outcome: str | None


class Reads:
    """Read-only questions about one namespace, asked of its broker's connection."""

    __slots__ = ("_broker",)

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def server_time_ms(self) -> int:
        """Redis's clock, unix ms: what expiries stored in Redis are judged by."""
        seconds, micros = await self._broker.commands.call("TIME")
        return int(seconds) * 1000 + int(micros) // 1000

    async def server_run_id(self) -> str:
        """The ``run_id`` of the Redis server answering: new at every start."""
        info = await self._broker.commands.call("INFO", "server")
        return str(info["run_id"])

    async def request_state(self, request_id: str) -> str | None:
        """``pending``, a settled state, or None once the request's hash is gone."""
        state = await self._broker.commands.call("HGET", self._broker.keys.request(request_id), "state")
        return None if state is None else str(state)

    async def stored_request(self, request_id: str) -> str | None:
        """The request's JSON as its hash keeps it, while it exists."""
        stored = await self._broker.commands.call("HGET", self._broker.keys.request(request_id), "request")
        return None if stored is None else str(stored)

    async def settlement(self, request_id: str) -> Settlement:
        keys, call = self._broker.keys, self._broker.commands.call
        (state, by), outcome = await asyncio.gather(
            call("HMGET", keys.request(request_id), "state", "by"), call("GET", keys.outcome(request_id))
        )
        return Settlement(state, by, outcome)

    async def agent_owners(self, agent_ids: list[str]) -> list[str | None]:
        """Each agent's owner (None: none, or no such agent), read in one pipeline."""
        keys, send = self._broker.keys, self._broker.commands.send
        return list(await asyncio.gather(*(send("HGET", keys.agent(agent_id), "owner") for agent_id in agent_ids)))

    async def away_until(self, request_ids: list[str]) -> list[float | None]:
        """When each request's detach grace ends (unix ms; None: its asker is not away)."""
        scores = await self._broker.commands.call("ZMSCORE", self._broker.keys.away, *request_ids)
        return [None if score is None else float(score) for score in scores or ()]

    async def queued_asks(self, most: int) -> list[QueuedAsk]:
        """The oldest ``most`` asks of the provider's stream, each with its request hash as it is now."""
        keys, call = self._broker.keys, self._broker.commands.call
        entries = await call("XRANGE", keys.requests, "-", "+", "COUNT", most)
        asks = [fields for _, flat in entries if (fields := _pairs(flat)).get("kind") == "ask" and fields.get("rid")]
        hashes = await asyncio.gather(
            *(call("HMGET", keys.request(fields["rid"]), "state", "created", "request") for fields in asks)
        )
        return [
            QueuedAsk(fields["rid"], state, int(created or 0), fields.get("request") or stored or "")
            for fields, (state, created, stored) in zip(asks, hashes, strict=True)
        ]

    async def newest_audit(self, count: int, *, before: str | None = None) -> list[tuple[str, dict[str, str]]]:
        """The newest ``count`` entries of the audit and its human record, newest first (``audit.newest``); with
        ``before`` (an entry id), the newest of those older than it."""
        return await audit.newest(self._broker.commands, self._broker.keys, count, before=before)

    async def newest_asker_log(self, count: int, *, before: str | None = None) -> list[tuple[str, dict[str, str]]]:
        """The newest ``count`` entries of the askers' log (what askers say they did), newest first; with ``before``
        (an entry id), the newest of those older than it."""
        end = f"({before}" if before else "+"
        entries = await self._broker.commands.call("XREVRANGE", self._broker.keys.asklog, end, "-", "COUNT", count)
        return [(entry_id, _pairs(flat)) for entry_id, flat in entries]

    async def verify_audit(self) -> audit.AuditReport:
        """The audit's chain checked against the broker's trusted keys (``audit.verify``)."""
        return await audit.verify(self._broker.commands, self._broker.keys, self._broker.trusted_keys)


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
