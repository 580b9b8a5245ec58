"""The asking process's single answer waiter (DESIGN.md invariant 6 and 10).

Every settled request pushes a notice (its id and outcome) onto this process's inbox list;
one task blocks on that list and resolves the matching future, so waiting costs one connection
and O(1) Redis work per answer however many asks wait. The outcome itself is durable in the
per-request key, which is what makes the rest safe:

- a blocking read is never re-sent by the client library: when one breaks or misses its reply
  deadline, the notice it may have popped is lost with it, so every awaited outcome is re-read
  (catch-up) once Redis answers again;
- a sweep re-reads every awaited outcome every ``sweep_every`` seconds anyway (a notice lost in
  a failover, an answer written while this process was paused), and ends the asks whose request
  is gone from Redis (expired after the request TTL, or lost in a failover) with a coded error,
  once two sweeps in a row have found neither the request nor its outcome; both reads go in
  batches of 1000 ids (one MGET, one multi-key EXISTS), so a waiting question costs Redis about
  0.0004 commands a second at the default 5 s rather than an EXISTS of its own every sweep;
- the liveness beat runs on its own timer, never behind a blocking read, and leads the first pipeline after an
  outage (a Redis back empty lost the key that tells a provider this asker lives).

Bounds (``BLOCK_S`` + ``REPLY_MARGIN_S`` = 5 s): a silent connection is noticed within 5 s;
asks waiting on an unreachable or silent Redis fail with ``BROKER_UNAVAILABLE`` within
``unavailable_after`` + 10 s; an ask whose request is gone ends within 3 x ``sweep_every``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis, RedisCluster

from .._commands import Commands
from .._keys import TOMBSTONE_MS, Keys
from .._redis_errors import is_transient
from .._scripts import settled_cleanup
from ..backoff import Backoff
from ..errors import ASK_TIMED_OUT, BROKER_UNAVAILABLE, UserQuestionError

__all__ = ["Inbox"]

log = logging.getLogger(__name__)

_DRAIN = 1000
"""outcomes re-read in one MGET at most (catch-up and sweep)"""
_POP = 64
"""notices taken by one BLMPOP at most: the asks they end are resolved, and their next asks sent, in
slices, so the asker, Redis and the provider work on different slices at once rather than all
on one convoy of every ask in flight (at c=256 one slice of 1000 held throughput near 1/(the sum
of the three's CPU per ask))"""
BLOCK_S = 2.0
"""how long one BLMPOP blocks; an idle process costs one round trip per BLOCK_S"""
REPLY_MARGIN_S = 3.0
"""how long past its block a BLMPOP's reply may be late before the connection counts as silent"""


class Inbox:
    """Resolves one future per awaited request id from the process's inbox list."""

    def __init__(
        self,
        *,
        keys: Keys,
        client_id: str,
        commands: Commands,
        blocking: Redis | RedisCluster,
        liveness_ttl: float,
        unavailable_after: float,
        request_ttl: float,
        sweep_every: float = 5.0,
        accepts: Callable[[str, str], bool] = lambda request_id, outcome: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keys = keys
        self._client_id = client_id
        self._inbox_key = keys.inbox(client_id)
        self._liveness_key = keys.client(client_id)
        self._commands = commands
        self._blocking = blocking
        self._ttl_ms = int(liveness_ttl * 1000)
        self._beat_every = liveness_ttl / 3
        self._unavailable_after = unavailable_after
        self._request_ttl = request_ttl
        self._sweep_every = sweep_every
        self._clock = clock
        self._accepts = accepts
        """whether an outcome may end the ask of a request id (an answer must be sealed for it)"""
        self._waiting: dict[str, asyncio.Future[str]] = {}
        self._asked_at: dict[str, float] = {}
        """ids whose ask script returned: they exist in Redis, and when they were asked"""
        self._missing: set[str] = set()
        """ids the last sweep found neither as a request nor as an outcome"""

    def expect(self, request_id: str) -> asyncio.Future[str]:
        """A future for the outcome JSON of ``request_id``; call before enqueueing it."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return future

    def enqueued(self, request_id: str) -> None:
        """The ask script accepted ``request_id``: from now on the sweep looks for it."""
        if request_id in self._waiting:
            self._asked_at[request_id] = self._clock()

    def forget(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)
        self._asked_at.pop(request_id, None)
        self._missing.discard(request_id)

    async def beat(self) -> None:
        """Mark this asking process alive (providers skip requests of processes that stopped)."""
        for command in self._beat_commands():
            await self._commands.call(*command)

    def _beat_commands(self) -> tuple[tuple[str | int, ...], ...]:
        """What marks this asking process alive: its liveness key, and its inbox kept as long."""
        return ("SET", self._liveness_key, "1", "PX", self._ttl_ms), ("PEXPIRE", self._inbox_key, self._ttl_ms)

    async def keep_alive(self) -> None:
        """Beat every third of the liveness TTL until cancelled, whatever the blocking read does; and first in
        every pipeline after an outage, ahead of the asks queued in it: a Redis that came back empty has lost the
        key, and a provider withdraws the ask of a process without one (deliver.lua)."""
        stops = [self._commands.lead_command_after_outage(*command) for command in self._beat_commands()]
        try:
            await _every(self._beat_every, self.beat, "liveness beat")
        finally:
            for stop in stops:
                stop()

    async def run(self) -> None:
        """Block on the inbox until cancelled; never ends on a Redis failure."""
        catch_up = False
        backoff = Backoff(first=0.05, cap=2.0)
        down_since: float | None = None
        while True:
            try:
                if catch_up:
                    await self._catch_up()
                    catch_up = False
                async with asyncio.timeout(BLOCK_S + REPLY_MARGIN_S):
                    popped = await self._blocking.execute_command(
                        "BLMPOP", BLOCK_S, 1, self._inbox_key, "LEFT", "COUNT", _POP
                    )
                if popped is not None:
                    await self._take(popped[1])
                backoff.reset()
                down_since = None
            except Exception as error:
                # A notice popped just before the read broke is lost with it: re-read every
                # outcome still awaited once Redis answers again.
                catch_up = True
                now = self._clock()
                down_since = down_since if down_since is not None else now
                if not is_transient(error):
                    log.error("inbox wait failed: %r; retrying", error)
                else:
                    log.warning("inbox wait interrupted (%r); retrying", error)
                if now - down_since >= self._unavailable_after:
                    self._fail_waiting(f"Redis unreachable for {now - down_since:.0f}s: {error!r}")
                await asyncio.sleep(backoff.next())

    async def sweep(self) -> None:
        """Every ``sweep_every`` seconds, re-read awaited outcomes and end asks whose request is gone."""
        await _every(self._sweep_every, self._sweep_once, "inbox sweep")

    async def _sweep_once(self) -> None:
        settled_before = self._clock() - self._sweep_every
        ids = [i for i, asked in self._asked_at.items() if asked <= settled_before]
        for start in range(0, len(ids), _DRAIN):
            unresolved = await self._resolve(ids[start : start + _DRAIN])
            if not unresolved:
                continue
            gone = set(await self._gone(unresolved))
            # One miss may be a server still switching roles after a failover: end an ask only
            # when the next sweep misses its request again.
            confirmed, self._missing = gone & self._missing, (self._missing - set(unresolved)) | gone
            for request_id in confirmed:
                self._end_lost(request_id)

    async def _gone(self, ids: list[str], present: int | None = None) -> list[str]:
        """The ids whose request hash is gone: one multi-key EXISTS for them all, split in halves
        only where the count comes back short, so a waiting question costs a share of one command
        per sweep rather than one of its own (issue 27), and k gone of n cost about 2k log2(n/k)."""
        if present is None:
            present = await self._commands.call("EXISTS", *(self._keys.request(i) for i in ids))
        if present >= len(ids):
            return []
        if present == 0:
            return ids
        halves = [ids[: len(ids) // 2], ids[len(ids) // 2 :]]
        counts = await asyncio.gather(
            *(self._commands.call("EXISTS", *(self._keys.request(i) for i in half)) for half in halves)
        )
        found = await asyncio.gather(*(self._gone(half, count) for half, count in zip(halves, counts, strict=True)))
        return [request_id for part in found for request_id in part]

    def _end_lost(self, request_id: str) -> None:
        future = self._waiting.pop(request_id, None)
        asked = self._asked_at.pop(request_id, None)
        self._missing.discard(request_id)
        if future is None or future.done():
            return
        age = self._clock() - asked if asked is not None else 0.0
        if age >= self._request_ttl:
            error = UserQuestionError(f"the request expired unanswered after {age:.0f}s (request_ttl)", ASK_TIMED_OUT)
        else:
            error = UserQuestionError(
                f"request {request_id} is gone from Redis (lost in a failover or a restart without persistence)",
                BROKER_UNAVAILABLE,
            )
        log.warning("ending ask %s: %s", request_id, error)
        future.set_exception(error)

    def fail_all(self, error: UserQuestionError) -> None:
        """End every ask still waiting with ``error`` (the broker is closing)."""
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(error)

    def _fail_waiting(self, why: str) -> None:
        """Redis is gone for good (as far as we can wait): no ask hangs on it."""
        self.fail_all(UserQuestionError(why, BROKER_UNAVAILABLE))

    async def _catch_up(self) -> None:
        """Re-read every awaited outcome; each read has the reply deadline of one blocking read (with
        25 000 waiting, one deadline for them all was missed on a busy machine, again and again, until
        every ask failed as if Redis were down)."""
        ids = list(self._waiting)
        for start in range(0, len(ids), _DRAIN):
            async with asyncio.timeout(BLOCK_S + REPLY_MARGIN_S):
                await self._resolve(ids[start : start + _DRAIN])
        async with asyncio.timeout(BLOCK_S + REPLY_MARGIN_S):
            await self.beat()

    async def _take(self, notices: list[str]) -> None:
        """Resolve from the notices: ``<request id> <outcome JSON>``, or a bare id to look up.

        ``<request id> ~<outcome JSON>`` ends a wait without cleaning the request up: another
        process re-attached to that keyed request.
        """
        bare: list[str] = []
        for notice in notices:
            request_id, _, outcome = notice.partition(" ")
            if not outcome:
                bare.append(request_id)
                continue
            if outcome.startswith("~"):  # ends a waiter here, if any; the request lives on elsewhere
                if request_id in self._waiting and self._accepts(request_id, outcome[1:]):
                    replaced = self._waiting.pop(request_id)
                    if not replaced.done():
                        replaced.set_result(outcome[1:])
                continue
            future = self._waiting.get(request_id)
            if future is not None and not self._accepts(request_id, outcome):
                continue  # not an answer: the ask waits on
            future = self._waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(outcome)
            elif future is None:  # nobody here waits for it (any more): clean up, unless a keyed asker may re-attach
                settled_cleanup(
                    self._commands,
                    settled=[self._keys.request(request_id), self._keys.outcome(request_id)],
                    tombstone=TOMBSTONE_MS,
                    client=self._client_id,
                    unclaimed="unclaimed",
                )
        if bare:  # housekeeping's notices carry no outcome
            await self._resolve(bare)

    async def _resolve(self, ids: list[str]) -> list[str]:
        """Resolve every id whose outcome is stored; returns the ids still without one."""
        outcomes = await self._commands.call("MGET", *(self._keys.outcome(i) for i in ids))
        unresolved: list[str] = []
        for request_id, outcome in zip(ids, outcomes, strict=True):
            if outcome is None or (request_id in self._waiting and not self._accepts(request_id, outcome)):
                unresolved.append(request_id)
                continue
            future = self._waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(outcome)
        return unresolved


async def _every(seconds: float, step: Callable[[], Awaitable[None]], what: str) -> None:
    """Run ``step`` every ``seconds`` until cancelled; a failed one is logged, and the next runs on time."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except Exception as error:
            log.warning("%s failed: %r", what, error)
