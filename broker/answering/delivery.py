"""Delivering the request stream to the lease holder's cards.

The holder's reads follow the client's rules (docs/architecture.md): a blocking read is never
re-sent and has a reply deadline; after a broken read the holder claims its own pending list
again, and every ``reclaim_every`` seconds it claims entries that sat idle in any consumer's
pending list (a fenced reader may have taken them after the holder's last claim). No Redis
failure ends the reader: it waits the failure out until the lease is lost.

Each read's asks go through one deliver.lua call; its notices (withdraw, away, back) update
the cards they name; a malformed entry or an undeliverable request is dead-lettered.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from typing import Any

import msgspec
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from .._commands import Commands
from .._keys import GROUP, Keys
from .._redis_errors import is_transient
from .._scripts import Delivering, Refusal, deadletter, deliver, notice_ack
from ..backoff import Backoff
from ..errors import UserQuestionError
from ..types import decode_request, encode
from ..validation import check_request
from .cards import Cards, Member, PendingRequest
from .lease import REPLY_MARGIN_S, Lease

__all__ = ["Delivery", "ensure_group"]

log = logging.getLogger(__name__)

_READ_COUNT = 256
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
_NOTICES = ("withdraw", "away", "back")
"""stream entries that are notices about a request, not asks"""

_Ask = tuple[str, dict[str, str], str, str]
"""one ask of a read: its entry id, its fields, its request id and its asking client"""


class Delivery:
    """Reads the request stream as the lease holder's consumer and presents what it reads as cards."""

    def __init__(self, lease: Lease, cards: Cards, *, blocking: Redis | RedisCluster, consumer: str) -> None:
        self.lease = lease
        self.cards = cards
        self.commands = lease.commands
        self.keys = lease.keys
        self.settings = lease.settings
        self.consumer = consumer
        self._blocking = blocking
        self._delivering: set[str] = set()
        self._claiming_backlog = False
        """the whole pending list is being claimed (``_claim_backlog``): a reclaim meanwhile would claim and parse
        again what it is about to deliver (a take-over of 100 000)"""

    async def read(self) -> None:
        """Deliver the stream's requests into the local queue until the lease is lost."""
        backoff = Backoff(first=0.05, cap=2.0)
        claim_backlog = True
        block_s = self.settings.block_s
        while not self.lease.lost:
            try:
                if claim_backlog:
                    await self._claim_backlog()
                    claim_backlog = False
                async with asyncio.timeout(block_s + REPLY_MARGIN_S):
                    reply = await self._blocking.xreadgroup(
                        GROUP, self.consumer, {self.keys.requests: ">"}, count=_READ_COUNT, block=int(block_s * 1000)
                    )
                for _stream, entries in reply or ():
                    await self._take(entries)
                backoff.reset()
            except Exception as error:
                if isinstance(error, ResponseError) and "NOGROUP" in str(error):
                    claim_backlog = True  # creates the group
                    continue
                # Entries read just before the break sit in our pending list: claim them again.
                claim_backlog = True
                delay = backoff.next()
                if is_transient(error):
                    log.warning("provider read interrupted (%r); retrying in %.2fs", error, delay)
                else:
                    log.error("provider read failed (%r); retrying in %.2fs", error, delay)
                await asyncio.sleep(delay)

    async def reclaim(self) -> None:
        """Every ``reclaim_every`` seconds, claim entries idle in any pending list and present them."""
        settings = self.settings
        min_idle_ms = int(settings.reclaim_every * 1000)
        while not self.lease.lost:
            await asyncio.sleep(settings.reclaim_every)
            if self._claiming_backlog:
                continue  # it claims every pending entry, idle or not; the next round looks again
            try:
                await self._reclaim_idle(min_idle_ms)
            except Exception as error:
                log.warning("reclaiming idle entries failed: %r", error)

    async def _reclaim_idle(self, min_idle_ms: int) -> None:
        cards = self.cards
        start = "-"
        while True:
            idle = await self.commands.call(
                "XPENDING", self.keys.requests, GROUP, "IDLE", min_idle_ms, start, "+", _READ_COUNT, parse_detail=True
            )
            ids = [entry["message_id"] for entry in idle if not cards.holds_entry(entry["message_id"])]
            if ids:
                claimed = await self.commands.call(
                    "XCLAIM", self.keys.requests, GROUP, self.consumer, min_idle_ms, *ids
                )
                await self._take([(entry_id, _pairs(fields)) for entry_id, fields in claimed if fields is not None])
            if len(idle) < _READ_COUNT:
                return
            start = "(" + idle[-1]["message_id"]

    async def _claim_backlog(self) -> None:
        """Take over every entry a previous holder (or we, before a reconnect) left unsettled."""
        await ensure_group(self.commands, self.keys)

        def claim(cursor: str) -> asyncio.Future[Any]:
            return self.commands.send(
                "XAUTOCLAIM", self.keys.requests, GROUP, self.consumer, 0, cursor, "COUNT", _READ_COUNT
            )

        # The next read is claimed while this one is delivered (one round trip for both, not two in turn): a
        # backlog of 100 000 is 391 reads. What is claimed and not yet delivered when this stops (fenced, Redis
        # gone) sits in this consumer's pending list, claimed again after a reconnect or by the next holder.
        claiming = claim("0-0")
        self._claiming_backlog = True
        try:
            while True:
                reply = await claiming
                cursor, entries = reply[0], reply[1]
                if cursor != "0-0":
                    claiming = claim(cursor)
                await self._take([(e[0], _pairs(e[1])) for e in entries if e and e[1] is not None])
                if cursor == "0-0" or self.lease.lost:
                    break
        finally:
            self._claiming_backlog = False
            if not claiming.done():
                claiming.cancel()
            elif not claiming.cancelled():
                claiming.exception()  # retrieved: a prefetch that failed after this stopped is only let go
        await self._drop_idle_consumers()

    async def _drop_idle_consumers(self) -> None:
        for consumer in await self.commands.call("XINFO", "CONSUMERS", self.keys.requests, GROUP):
            info = _pairs(consumer)
            if info.get("name") != self.consumer and int(info.get("pending", 0)) == 0:
                await self.commands.call("XGROUP", "DELCONSUMER", self.keys.requests, GROUP, info["name"])

    async def _take(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Present the entries of one read: all its asks through one deliver call, then its notices."""
        asks: list[_Ask] = []
        notices: list[tuple[str, str, str, str]] = []
        new_cards = False
        for entry_id, fields in entries:
            kind, request_id, client_id = fields.get("kind"), fields.get("rid", ""), fields.get("client", "")
            if kind in _NOTICES and request_id:
                notices.append((entry_id, kind, request_id, client_id))
            elif kind != "ask" or not _ID.match(request_id) or not _ID.match(client_id):
                await self._dead_letter(entry_id, fields, "malformed stream entry")
            elif self.cards.card_of(request_id) is None and request_id not in self._delivering:
                asks.append((entry_id, fields, request_id, client_id))
                self._delivering.add(request_id)
        shown: list[tuple[PendingRequest, bool]] = []
        try:
            if asks:
                shown = await self._deliver(asks)
        finally:
            self._delivering.difference_update(request_id for _, _, request_id, _ in asks)
        for pending, coalesce in shown:
            if self.cards.place(pending, coalesce) is not None:
                new_cards = True
        try:
            for entry_id, kind, request_id, _client_id in notices:
                if not await self._take_notice(entry_id, kind, request_id):
                    break
        finally:
            if new_cards:  # woken once this read's withdraw notices have taken their cards down
                self.cards.wake.set()

    async def _take_notice(self, entry_id: str, kind: str, request_id: str) -> bool:
        """A notice: take the card down (withdraw), or mark its asker away or back; False when fenced.

        A ``back`` notice may name the request's new asking process: settlements go to it.
        """
        acked = await notice_ack(self.commands, **self.lease.on_stream, entry=entry_id)
        if not acked:
            self.lease.fenced()
            return False
        if self.cards.card_of(request_id) is None:
            return True
        if kind == "withdraw":
            self.cards.withdraw(request_id)
            return True
        # The notice says something changed; what is true now is the request hash's.
        client, away, remember = await self.commands.call(
            "HMGET", self.keys.request(request_id), "client", "away", "remember"
        )
        self.cards.update_asker(
            request_id,
            away_notice=kind == "away",
            client=client,
            rebind_to=client if client and _ID.match(client) else None,
            away=away,
            remember=remember,
            attested=self._member_attested,
        )
        return True

    async def _deliver(self, asks: list[_Ask]) -> list[tuple[PendingRequest, bool]]:
        """deliver.lua for one read's asks; each presentable one with whether it may be coalesced.

        Who asks is the request hash's: an ask whose hash names another client than its entry (a keyed ask
        re-attached) is delivered again with that client's keys.
        """
        shown: list[tuple[PendingRequest, bool]] = []
        for _ in range(3):
            moved = await self._deliver_once(asks, shown)
            if not moved:
                break
            asks = moved
        return shown

    async def _deliver_once(self, asks: list[_Ask], shown: list[tuple[PendingRequest, bool]]) -> list[_Ask]:
        keys, settings = self.keys, self.settings
        deliveries = await deliver(
            self.commands,
            **self.lease.on_stream,
            audit=keys.audit,
            away=keys.away,
            epoch=self.lease.epoch,
            result_ttl=int(settings.result_ttl * 1000),
            audit_max=settings.audit_maxlen,
            liveness_grace=int(settings.liveness_grace * 1000),
            entries=[self._delivering_entry(*ask) for ask in asks],
        )
        if isinstance(deliveries, Refusal):
            self.lease.fenced()
            return []
        moved: list[_Ask] = []
        for (entry_id, fields, request_id, client_id), one in zip(asks, deliveries, strict=True):
            if one.kind == "moved":
                moved.append((entry_id, fields, request_id, str(one.client)))
                continue
            if one.kind == "gone":
                log.info("request %s not presented: %s", request_id, one.body)
                continue
            raw: str = fields.get("request") or one.body  # type: ignore[assignment]
            try:
                request = decode_request(raw)
                check_request(request, settings.limits)
            except (msgspec.DecodeError, UserQuestionError) as error:
                await self._dead_letter(entry_id, fields, f"undeliverable request: {error}")
                continue
            # the hash's word (who asks, the opt-outs), the entry's only for a hash written before it had them
            remember = one.remember or fields.get("remember", "1")
            coalesce = one.coalesce or fields.get("coalesce", "1")
            attestation, sha = fields.get("attest", ""), hashlib.sha256(raw.encode()).hexdigest()
            client = one.client if one.client is not None else client_id
            pending = PendingRequest(
                self.cards,
                request_id=request_id,
                request=request,
                request_sha=sha,
                client_id=client,
                created_ms=one.created_ms,
                entry_id=entry_id,
                asker_away=one.away,
                durable=one.key,
                opted_out=remember == "0",
                attestation=attestation,
                verified=self._attested(attestation, request_id, sha, request.agent, client),
                deadline_ms=one.deadline_ms,
            )
            shown.append((pending, self.cards.coalesce and coalesce != "0"))
        return moved

    def _delivering_entry(self, entry_id: str, fields: dict[str, str], request_id: str, client_id: str) -> Delivering:
        keys = self.keys
        agent_id = fields.get("agent", "")
        request_key = keys.request(request_id)
        return Delivering(
            request=request_key,
            record=keys.agent(agent_id) if agent_id else request_key,
            liveness=keys.client(client_id),
            inbox=keys.inbox(client_id),
            outcome=keys.outcome(request_id),
            entry=entry_id,
            rid=request_id,
            want_body="0" if "request" in fields else "1",
        )

    def _attested(self, attestation: str, request_id: str, request_sha: str, agent: str | None, client: str) -> bool:
        """Whether a pinned gateway attested this very ask: request, agent and asking process."""
        gateways = self.settings.gateway_keys
        if not gateways or not attestation:
            return False
        return gateways.verify_attestation(
            attestation,
            namespace=self.keys.namespace,
            request_id=request_id,
            request_sha=request_sha,
            agent=agent or "",
            client=client,
        )

    def _member_attested(self, member: Member) -> bool:
        return self._attested(
            member.attestation, member.request_id, member.request_sha, member.request.agent, member.client_id
        )

    async def _dead_letter(self, entry_id: str, fields: dict[str, str], reason: str) -> None:
        keys = self.keys
        request_id, client_id = fields.get("rid", ""), fields.get("client", "")
        known = bool(_ID.match(request_id) and _ID.match(client_id))
        log.warning("dead-lettering stream entry %s: %s", entry_id, reason)
        await deadletter(
            self.commands,
            requests=keys.requests,
            dead=keys.dead,
            request=keys.request(request_id) if known else keys.dead,
            outcome=keys.outcome(request_id) if known else keys.dead,
            inbox=keys.inbox(client_id) if known else keys.dead,
            audit=keys.audit,
            entry=entry_id,
            reason=reason,
            group=GROUP,
            dead_max=self.settings.dead_maxlen,
            result_ttl=int(self.settings.result_ttl * 1000),
            rid=request_id if known else "",
            audit_max=self.settings.audit_maxlen,
            fields=encode(fields),
        )


async def ensure_group(commands: Commands, keys: Keys) -> None:
    """Create the providers' consumer group, reading from the stream's start."""
    try:
        await commands.call("XGROUP", "CREATE", keys.requests, GROUP, "0", "MKSTREAM")
    except ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise


def _pairs(flat: Any) -> dict[str, Any]:
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))
