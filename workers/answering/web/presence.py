"""Where this web server stands in its namespace, as its pages see it: serving, standing by behind a
holder (whose page it links and whose requests it lists read-only), asking for a take-over, and whether
Redis answers. ``Presence.run()`` keeps that true while the provider stands by and serves.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Literal

import msgspec
from redis.exceptions import RedisError

from broker import PRIORITIES, AskUserQuestionRequest, Broker, Reads, UserQuestionError
from broker.types import decode_request
from workers.answering.web.errors import REDIS_DOWN
from workers.answering.web.keys import WebKeys
from workers.answering.web.render import readonly_view, safe_url

__all__ = ["NOT_STANDING_BY", "PROBE_EVERY_S", "Presence", "Status"]

log = logging.getLogger(__name__)

Status = Literal["connecting", "standby", "active", "stopped"]
Event = dict[str, Any]

NOT_STANDING_BY = "NOT_STANDING_BY"
PROBE_EVERY_S = 1.0
_PROBE_TIMEOUT_S = 1.5
_RUN_TIMEOUT_S = 0.5
"""how often and how patiently Redis is pinged, so pages learn of an outage in seconds, not after
the broker's own retries (``unavailable_after``) give up"""
_READONLY_EVERY_S = 1.0
_READONLY_MAX = 500
"""while standing by, the holder's pending requests are read this often, this many at most, to list them read-only"""


class Presence:
    """This server's status in one namespace, and the loops that keep it (and the pages) up to date."""

    def __init__(
        self,
        broker: Broker,
        *,
        name: str,
        keys: WebKeys,
        public_url: str,
        handover_grace: float,
        publish: Callable[[Event | None], None],
        routes: Callable[[AskUserQuestionRequest, int], list[str]],
    ) -> None:
        self.broker = broker
        self.name, self.keys, self.public_url, self.handover_grace = name, keys, public_url, handover_grace
        self._publish = publish
        self._routes = routes
        """the groups a request listed read-only is routed to (``Cards.routes_for``): pages route it as a live card"""
        self.status: Status = "connecting"
        self.holder = ""
        self.holder_url = ""
        self.redis_ok = True
        self.readonly: list[dict[str, Any]] = []
        """while standing by: the requests the holder serves, listed read-only"""
        self.takeover_by = ""
        """who asked, here, for the lease (cleared once this server serves, or stops standing by)"""
        self.takeover_late = False
        """the take-over asked here is past that bound and the holder still holds the lease"""
        self._takeover_until = 0.0
        """when (loop time) the take-over asked here should have completed (``Broker.handover_within``)"""
        self._redis_run: tuple[float, str | None] = (-PROBE_EVERY_S, None)
        """when ``redis_run`` last read it (the loop's time), and what it read"""
        self._status_changed = asyncio.Event()
        self._holder_changed = asyncio.Event()

    def status_event(self) -> Event:
        return {
            "type": "status",
            "namespace": self.broker.namespace,
            "status": self.status,
            "holder": self.holder,
            "holderUrl": self.holder_url if self.status == "standby" else "",
            "name": self.name,
            "redis": "ok" if self.redis_ok else "down",
            "takeoverBy": self.takeover_by if self.status == "standby" else "",
            "takeoverWithinS": round(self.broker.handover_within(self.handover_grace)),
            "takeoverGraceS": self.handover_grace,
            "takeoverLate": self.takeover_late and self.status == "standby",
        }

    def set_status(self, status: Status, holder: str = "") -> None:
        if (status, holder) != (self.status, self.holder):
            self.holder_url = ""
        if status != "standby":
            self.takeover_by, self.takeover_late = "", False
        self.status, self.holder = status, holder
        self._status_changed.set()
        self._holder_changed.set()
        self._publish(self.status_event())

    async def take_over(self, *, by: str) -> None:
        """Ask the lease holder to hand the lease to this server (it stands by meanwhile)."""
        if self.status != "standby":
            raise UserQuestionError("this server is not standing by behind another provider", NOT_STANDING_BY)
        await self.broker.request_handover(self.name, by=by, grace=self.handover_grace)
        log.info("%s asked %s to hand the lease of %s to %s", by, self.holder, self.broker.namespace, self.name)
        self.takeover_by, self.takeover_late = by, False
        self._takeover_until = asyncio.get_running_loop().time() + self.broker.handover_within(self.handover_grace)
        self._publish(self.status_event())

    def _check_takeover(self) -> None:
        """Past the bound a take-over asked here should have met, say so once (the page says why and what to do)."""
        late = bool(self.takeover_by) and asyncio.get_running_loop().time() > self._takeover_until
        if late and not self.takeover_late and self.status == "standby":
            log.warning("%s has not handed the lease of %s over to %s", self.holder, self.broker.namespace, self.name)
            self.takeover_late = True
            self._publish(self.status_event())

    async def redis_run(self) -> str | None:
        """Which run of this server's Redis answers (a digest of its ``run_id``, new at every start), read at most
        once a second; None when it does not answer. A page whose session vanished compares it with the one it saw
        signing in: a Redis that restarted since, and kept no session, lost its data (it started empty)."""
        now = asyncio.get_running_loop().time()
        read_at, run = self._redis_run
        if now - read_at >= PROBE_EVERY_S:
            try:
                async with asyncio.timeout(_RUN_TIMEOUT_S):  # /healthz waits for it, at most once a second
                    run_id = await Reads(self.broker).server_run_id()
                run = hashlib.sha256(run_id.encode()).hexdigest()[:16]
            except (*REDIS_DOWN, RedisError, UserQuestionError, TimeoutError, KeyError, TypeError):
                run = None  # down, or a Redis user without INFO (the page then says only that the session ended)
            self._redis_run = (now, run)
        return run

    async def run(self) -> None:
        """Advertise, probe Redis and follow the holder until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._advertise(), name="qb-web-advertise")
            tasks.create_task(self._probe_redis(), name="qb-web-probe-redis")
            tasks.create_task(self._follow_holder(), name="qb-web-follow-holder")

    async def _probe_redis(self) -> None:
        """Ask Redis something every second; pages are told at once when it stops or starts answering."""
        while True:
            try:
                async with asyncio.timeout(_PROBE_TIMEOUT_S):
                    # A read of one of the namespace's own keys (it creates nothing): on a Cluster,
                    # that asks the master holding the namespace's slot, which is the one that matters.
                    await self.broker.commands.call("EXISTS", self.keys.public_url(self.name))
                ok = True
            except (*REDIS_DOWN, UserQuestionError, TimeoutError):
                ok = False
            if ok != self.redis_ok:
                log.warning("web provider %s: Redis %s", self.name, "answers again" if ok else "does not answer")
                self.redis_ok = ok
                self._publish(self.status_event())
            await asyncio.sleep(PROBE_EVERY_S)

    async def _follow_holder(self) -> None:
        """While standing by, list the holder's pending requests read-only (read every second).

        A standby is not in the consumer group's reading: it reads the stream's outstanding entries
        and each one's request hash, and shows those still pending. Nothing is written.
        """
        while True:
            listed: list[dict[str, Any]] = []
            self._check_takeover()
            if self.status == "standby":
                try:
                    listed = await self._read_holders_requests()
                except (*REDIS_DOWN, UserQuestionError) as error:
                    log.debug("cannot list the holder's requests: %s", error)
                    listed = self.readonly
            if listed != self.readonly:
                self.readonly = listed
                self._publish({"type": "readonly", "namespace": self.broker.namespace, "requests": listed})
            self._holder_changed.clear()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._holder_changed.wait(), _READONLY_EVERY_S)

    async def _read_holders_requests(self) -> list[dict[str, Any]]:
        listed: list[tuple[int, int, dict[str, Any]]] = []
        for ask in await Reads(self.broker).queued_asks(_READONLY_MAX):
            if ask.state != "pending":
                continue
            try:
                request = decode_request(ask.request)
            except (msgspec.DecodeError, UserQuestionError, ValueError):
                continue
            view = readonly_view(ask.request_id, request, ask.created_ms)
            if routes := self._routes(request, ask.created_ms):
                view["routes"] = routes  # shown only to those groups' members (``stream``), as on the holder's page
            listed.append((PRIORITIES.index(request.priority), ask.created_ms, view))
        listed.sort(key=lambda item: item[:2])
        return [view for _, _, view in listed]

    async def _advertise(self) -> None:
        """While active, publish this page's public URL; while standing by, learn the holder's.

        The URL key carries a TTL a few leases long, refreshed every half lease, so a
        holder that died stops being linked soon after the lease passes on.
        """
        every = max(0.2, self.broker.lease_ttl / 2)
        ttl_ms = int(self.broker.lease_ttl * 3000)
        call = self.broker.commands.call
        while True:
            self._status_changed.clear()
            try:
                if self.status == "active" and self.public_url:
                    await call("SET", self.keys.public_url(self.name), self.public_url, "PX", ttl_ms)
                elif self.status == "standby" and self.holder:
                    url = safe_url(await call("GET", self.keys.public_url(self.holder)) or "")
                    if url != self.holder_url:
                        self.holder_url = url
                        self._publish(self.status_event())
            except (*REDIS_DOWN, UserQuestionError) as error:
                log.debug("cannot advertise the public URL: %s", error)
            with suppress(TimeoutError):
                await asyncio.wait_for(self._status_changed.wait(), every)
