"""The asking process's single answer waiter (DESIGN.md invariant 6).

Every settled request pushes a notice (its id and outcome) onto this process's inbox list;
one task blocks on that list and resolves the matching future, so waiting costs one connection and O(1)
Redis work per answer however many asks wait. The outcome itself is durable in the
per-request key, so after a lost connection the waiter re-reads every outcome it still
waits for and nothing is missed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ._commands import REDIS_DOWN, Commands, is_transient
from ._keys import Keys
from .errors import BROKER_UNAVAILABLE, UserQuestionError

__all__ = ["Inbox"]

log = logging.getLogger(__name__)

_DRAIN = 1000


class Inbox:
    """Resolves one future per awaited request id from the process's inbox list."""

    def __init__(
        self,
        *,
        keys: Keys,
        client_id: str,
        commands: Commands,
        blocking: Redis,
        liveness_ttl: float,
        unavailable_after: float,
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
        self._clock = clock
        self._waiting: dict[str, asyncio.Future[str]] = {}

    def expect(self, request_id: str) -> asyncio.Future[str]:
        """A future for the outcome JSON of ``request_id``; call before enqueueing it."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return future

    def forget(self, request_id: str) -> None:
        self._waiting.pop(request_id, None)

    async def beat(self) -> None:
        """Mark this asking process alive (providers skip requests of processes that stopped)."""
        await self._commands.call("SET", self._liveness_key, "1", "PX", self._ttl_ms)
        await self._commands.call("PEXPIRE", self._inbox_key, self._ttl_ms)

    async def run(self) -> None:
        """Block on the inbox until cancelled; the owning broker runs this in its task group."""
        next_beat = self._clock() + self._beat_every
        catch_up = False
        backoff = 0.05
        down_since: float | None = None
        while True:
            try:
                if catch_up:
                    await self._catch_up()
                    catch_up = False
                timeout = max(0.01, next_beat - self._clock())
                popped = await self._blocking.execute_command(  # type: ignore[no-untyped-call]
                    "BLMPOP", timeout, 1, self._inbox_key, "LEFT", "COUNT", _DRAIN
                )
                if popped is not None:
                    await self._take(popped[1])
                if self._clock() >= next_beat:
                    await self.beat()
                    next_beat = self._clock() + self._beat_every
                backoff = 0.05
                down_since = None
            except (*REDIS_DOWN, ResponseError) as error:
                if not is_transient(error):
                    raise
                # A notice popped just before the connection broke is lost with it: re-read
                # every outcome still awaited once Redis answers again.
                log.warning("inbox wait interrupted (%s); retrying in %.2fs", error, backoff)
                catch_up = True
                down_since = down_since if down_since is not None else self._clock()
                if self._clock() - down_since >= self._unavailable_after:
                    self._fail_waiting(f"Redis unreachable for {self._clock() - down_since:.0f}s: {error}")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    def _fail_waiting(self, why: str) -> None:
        """Redis is gone for good (as far as we can wait): no ask hangs on it."""
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(UserQuestionError(why, BROKER_UNAVAILABLE))

    async def _catch_up(self) -> None:
        ids = list(self._waiting)
        for start in range(0, len(ids), _DRAIN):
            await self._resolve(ids[start : start + _DRAIN], notified=False)
        await self.beat()

    async def _take(self, notices: list[str]) -> None:
        """Resolve from the notices: ``<request id> <outcome JSON>``, or a bare id to look up."""
        done: list[str] = []
        bare: list[str] = []
        for notice in notices:
            request_id, _, outcome = notice.partition(" ")
            if not outcome:
                bare.append(request_id)
                continue
            done.append(request_id)
            future = self._waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(outcome)
        if bare:
            await self._resolve(bare)
        await self._clean(done)

    async def _clean(self, done: list[str]) -> None:
        if done:
            # The asker has its outcome: nothing of the request need stay in Redis.
            stale = [self._keys.outcome(i) for i in done] + [self._keys.request(i) for i in done]
            await self._commands.call("UNLINK", *stale)

    async def _resolve(self, ids: list[str], *, notified: bool = True) -> None:
        outcomes = await self._commands.call("MGET", *(self._keys.outcome(i) for i in ids))
        done: list[str] = []
        for request_id, outcome in zip(ids, outcomes, strict=True):
            if outcome is None:
                if notified:
                    log.warning("request %s was settled but its outcome is gone", request_id)
                continue
            done.append(request_id)
            future = self._waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result(outcome)
        await self._clean(done)
