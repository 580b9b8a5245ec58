"""One connection for every command a process issues: auto-pipelining, retries and the scripts.

Commands issued while a pipeline is in flight are sent together in the next one, so a
process holds one command connection however many asks it runs at once, and a burst of
N commands costs about one round trip rather than N. Callers only await a future: the sender
task alone talks to redis-py, whose socket writes and polls can lose a cancellation.

Calls of a script that takes a batch (``ask.lua``) queued for the same pipeline go as one call
of that script (at most ``MERGE_MAX`` each): Redis runs one script call rather than one per
ask, and each caller gets its own reply. Each is judged as if called alone, in the order queued.

Every command the broker sends is safe to send again (the scripts are keyed by request and
call ids), so a command that meets a transient failure (a broken connection, a reply that
does not come within ``reply_timeout``, READONLY, OOM, LOADING, a cluster failover) is sent
again after a backoff, until ``give_up_after`` seconds have passed since it was issued; then
its caller gets ``BROKER_UNAVAILABLE``. Any other Redis error goes to its caller at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from ._lua import Script
from ._redis_errors import is_transient, unavailable
from .backoff import Backoff
from .connection import COMMAND_TIMEOUT

__all__ = ["Commands"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def _log_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.info("clean-up command failed: %r (its keys expire by TTL)", future.exception())


MERGE_MAX = 32
"""calls merged into one script call at most (a longer script would hold Redis up for longer)"""


@dataclass(slots=True, eq=False, repr=False)
class _Queued:
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    give_up_at: float
    options: dict[str, Any]
    merge: str | None = None
    """the SHA of a script that takes a batch: queued calls of it go as one"""


def _merged(batch: list[_Queued]) -> list[tuple[tuple[Any, ...], dict[str, Any], list[_Queued]]]:
    """The pipeline's commands: (arguments, reply options, the queued calls it answers, in order).

    Calls of a batching script go as one call of it, where the first of them was queued.
    """
    groups: list[list[_Queued]] = []
    open_groups: dict[str, list[_Queued]] = {}
    for queued in batch:
        group = open_groups.get(queued.merge) if queued.merge is not None else None
        if group is None or len(group) >= MERGE_MAX:
            group = []
            groups.append(group)
            if queued.merge is not None:
                open_groups[queued.merge] = group
        group.append(queued)
    return [(_batch_call(g) if len(g) > 1 else g[0].args, {} if len(g) > 1 else g[0].options, g) for g in groups]


def _batch_call(members: list[_Queued]) -> tuple[Any, ...]:
    """One EVALSHA for several calls of a batching script: their KEYS, then '*', n, the counts, their ARGV."""
    keys: list[Any] = []
    argv: list[Any] = []
    counts: list[int] = []
    for member in members:  # ("EVALSHA", sha, key count, *keys, *args)
        count = member.args[2]
        keys += member.args[3 : 3 + count]
        argv += member.args[3 + count :]
        counts += [count, len(member.args) - 3 - count]
    return ("EVALSHA", members[0].args[1], len(keys), *keys, "*", len(members), *counts, *argv)


class Commands:
    """Sends commands over one client connection, batching whatever is queued."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        reply_timeout: float = COMMAND_TIMEOUT,
        give_up_after: float = 30.0,
    ) -> None:
        self._client = client
        self._plain_scripts = type(client).__module__.startswith("fakeredis")
        self._reply_timeout = reply_timeout
        self._give_up_after = give_up_after
        self._queue: list[_Queued] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._backoff = Backoff(first=0.05, cap=1.0)
        # An outage is logged once when it starts and once when it ends: a retry every second
        # would bury the coded error a short-lived command ends with (and fill a long-lived one's log).
        self._outage_since: float | None = None
        # A Redis or Sentinel client's pipelines go over one connection kept here (closed with the
        # client's pool); a Cluster client routes each command to its slot's node, and fakeredis
        # has no sockets: both keep redis-py's pipeline.
        self._direct = isinstance(client, Redis) and not self._plain_scripts
        self._connection: Any = None
        self._refilling: dict[str, asyncio.Future[None]] = {}
        """the scripts whose source one call is sending again after NOSCRIPT, by SHA (``_refilled``)"""
        self._leads: list[tuple[Callable[[], tuple[Any, ...]], Callable[[Any], None]]] = []
        """commands sent first in every pipeline while Redis fails (``lead_after_outage``): each one's arguments
        (made when sent) and what takes its reply"""
        self.last_refusal: BaseException | None = None
        """the transient failure the commands last met, None once a pipeline went through: what
        a caller that gives up waiting tells its user (a full server, an unknown host)"""

    async def call(self, *args: Any, **options: Any) -> Any:
        """Send one command with the next pipeline; ``options`` go to redis-py's reply parser."""
        return await self.send(*args, **options)

    def send(self, *args: Any, **options: Any) -> asyncio.Future[Any]:
        """``call`` without a coroutine: the future of its reply. Many of them gathered cost no task each
        (a failover's 500 cards' contexts: 500 tasks a batch were a tenth of the take-over's CPU)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Queued(args, future, loop.time() + self._give_up_after, options))
        self._wakeup.set()
        self._idle.clear()
        return future

    async def _merged_call(self, sha: str, args: tuple[Any, ...]) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append(_Queued(args, future, loop.time() + self._give_up_after, {}, merge=sha))
        self._wakeup.set()
        self._idle.clear()
        return await future

    def fire(self, *args: Any) -> None:
        """Queue a command whose reply nobody awaits (a clean-up); a failure is only logged."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        future.add_done_callback(_log_failure)
        self._queue.append(_Queued(args, future, loop.time() + self._give_up_after, {}))
        self._wakeup.set()
        self._idle.clear()

    def fire_script(self, script: Script, keys: list[str], args: list[Any]) -> None:
        """Queue a script call whose reply nobody awaits (a clean-up); after NOSCRIPT it goes again as EVAL."""
        source, sha = (script.plain, script.plain_sha) if self._plain_scripts else (script.source, script.sha)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def done(future: asyncio.Future[Any]) -> None:
            if not future.cancelled() and isinstance(future.exception(), NoScriptError):
                self.fire("EVAL", source, len(keys), *keys, *args)
            else:
                _log_failure(future)

        future.add_done_callback(done)
        self._queue.append(
            _Queued(("EVALSHA", sha, len(keys), *keys, *args), future, loop.time() + self._give_up_after, {})
        )
        self._wakeup.set()
        self._idle.clear()

    def lead_after_outage(
        self, script: Script, keys: list[str], args: list[Any], on_reply: Callable[[Any], None]
    ) -> Callable[[], None]:
        """Send this script call first in every pipeline after a transient failure, until one goes through, its
        reply to ``on_reply`` (a failed try is dropped, not sent again: the next pipeline leads with it anew).

        Commands queued during an outage go in the order queued once Redis is back: a lease holder's renewal
        that is to take back a lease lapsed in a restart must run before the fenced scripts queued before it
        (broker/answering/provider.py). Sent as EVAL: a restarted server's script cache is empty. Returns what
        stops it."""

        def call() -> tuple[Any, ...]:
            return ("EVAL", script.plain if self._plain_scripts else script.source, len(keys), *keys, *args)

        return self._lead_with(call, on_reply)

    def lead_command_after_outage(self, *args: Any) -> Callable[[], None]:
        """``lead_after_outage`` for a plain command whose reply nobody reads (an asking process's liveness: an ask
        queued in the outage must not reach a provider before the key that says its asker lives)."""
        return self._lead_with(lambda: args, lambda reply: None)

    def _lead_with(self, call: Callable[[], tuple[Any, ...]], on_reply: Callable[[Any], None]) -> Callable[[], None]:
        lead = (call, on_reply)
        self._leads.append(lead)

        def stop() -> None:
            if lead in self._leads:
                self._leads.remove(lead)

        return stop

    def _lead(self) -> list[_Queued]:
        loop = asyncio.get_running_loop()
        queued: list[_Queued] = []
        for call, on_reply in self._leads:
            future: asyncio.Future[Any] = loop.create_future()

            def done(future: asyncio.Future[Any], on_reply: Callable[[Any], None] = on_reply) -> None:
                if not future.cancelled() and future.exception() is None:
                    on_reply(future.result())

            future.add_done_callback(done)
            queued.append(_Queued(call(), future, loop.time(), {}))
        return queued

    @overload
    async def script(self, script: Script, keys: list[str], args: list[Any]) -> Any: ...

    @overload
    async def script(self, script: Script, keys: list[str], args: list[Any], decode: Callable[[Any], _T]) -> _T: ...

    async def script(
        self, script: Script, keys: list[str], args: list[Any], decode: Callable[[Any], Any] | None = None
    ) -> Any:
        """Run a script; its reply through ``decode`` (broker/_scripts/: a binding adds no coroutine of its own)."""
        source, sha = (script.plain, script.plain_sha) if self._plain_scripts else (script.source, script.sha)
        try:
            if script.batches:
                reply = await self._merged_call(sha, ("EVALSHA", sha, len(keys), *keys, *args))
            else:
                reply = await self.call("EVALSHA", sha, len(keys), *keys, *args)
        except NoScriptError:
            reply = await self._refilled(sha, ("EVAL", source, len(keys), *keys, *args), script.batches)
        return reply if decode is None else decode(reply)

    async def _refilled(self, sha: str, evaluation: tuple[Any, ...], batches: bool) -> Any:
        """A call met NOSCRIPT: Redis restarted or flushed its script cache. The first such call of a script
        sends its source (EVAL caches it); those behind it wait for that reply and go by SHA again, so a
        burst of asks after a restart sends the source once, not once each. On a second NOSCRIPT (a cluster
        node the first EVAL did not reach) a call sends the source itself."""
        refilling = self._refilling.get(sha)
        if refilling is None:
            refilling = self._refilling[sha] = asyncio.get_running_loop().create_future()
            try:
                return await self.call(*evaluation)
            finally:
                del self._refilling[sha]
                refilling.set_result(None)  # whatever the EVAL did: a failed one leaves the others their own
        await asyncio.shield(refilling)  # a waiter cancelled leaves the others waiting
        again = ("EVALSHA", sha, *evaluation[2:])
        try:
            return await (self._merged_call(sha, again) if batches else self.call(*again))
        except NoScriptError:
            return await self.call(*evaluation)

    async def run(self) -> None:
        """Send queued commands until cancelled; the owner runs this as a background task.

        It never ends on a Redis failure: failed commands wait out a backoff and go again.
        """
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch = [queued for queued in self._queue if not queued.future.done()]
            self._queue = []
            if batch and self._outage_since is not None and self._leads:
                batch[:0] = self._lead()  # given up at once when it fails: the next try leads with it again
            if batch:
                retry = await self._send(batch)
                if retry:
                    self._queue[:0] = retry
                    await asyncio.sleep(self._backoff.next())
                    self._wakeup.set()
                    continue
                self._backoff.reset()
                if self._outage_since is not None:
                    down = asyncio.get_running_loop().time() - self._outage_since
                    log.warning("redis answers again, after %.1fs", down)
                    self._outage_since = None
            if not self._queue:
                self._idle.set()

    async def drain(self) -> None:
        """Wait until every queued command has been sent and answered."""
        await self._idle.wait()

    async def _send(self, batch: list[_Queued]) -> list[_Queued]:
        """Send one pipeline; returns the commands to send again after a transient failure."""
        commands = _merged(batch)
        try:
            async with asyncio.timeout(self._reply_timeout):
                if self._direct:
                    results = await self._exchange(commands)
                else:
                    pipe = self._client.pipeline(transaction=False)
                    for args, options, _ in commands:
                        pipe.execute_command(*args, **options)
                    results = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for queued in batch:
                queued.future.cancel()
            raise
        except Exception as error:  # the connection failed: the whole batch failed with it
            if not is_transient(error):
                log.warning("redis pipeline of %d commands failed: %r", len(batch), error)
                for queued in batch:
                    if not queued.future.done():
                        queued.future.set_exception(error)
                return []
            self._log_outage("redis pipeline of %d commands interrupted (%r); sending again", len(batch), error)
            self.last_refusal = error
            return self._again(batch, error)
        self.last_refusal = None
        retry: list[_Queued] = []
        last_error: BaseException | None = None
        replies: list[tuple[_Queued, Any]] = []
        for (_, _, members), result in zip(commands, results, strict=True):
            if len(members) > 1 and not isinstance(result, Exception):
                replies += zip(members, result, strict=True)
            else:  # one call, or a merged call that failed as a whole: each of its calls failed
                replies += ((queued, result) for queued in members)
        for queued, result in replies:
            if queued.future.done():
                continue
            if isinstance(result, Exception):
                if is_transient(result):
                    retry.append(queued)
                    last_error = result
                else:
                    queued.future.set_exception(result)
            else:
                queued.future.set_result(result)
        if last_error is not None:
            self._log_outage("%d redis commands refused for now (%s); sending again", len(retry), last_error)
            self.last_refusal = last_error
            return self._again(retry, last_error)
        return []

    def _log_outage(self, message: str, *args: Any) -> None:
        """A WARNING for an outage's first failure, DEBUG for each retry until Redis answers again."""
        if self._outage_since is None:
            self._outage_since = asyncio.get_running_loop().time()
            log.warning(message + " (until it answers; each retry at DEBUG)", *args)
        else:
            log.debug(message, *args)

    async def _exchange(self, commands: list[tuple[tuple[Any, ...], dict[str, Any], list[_Queued]]]) -> list[Any]:
        """One pipeline over the connection this object keeps; a Redis error reply is its command's result.

        redis-py's pipeline takes a pooled connection per call and polls its socket before use,
        about 20 us a round trip, which the asks at concurrency 1 pay on every hop of their path.
        A connection broken or left mid-reply (a timeout, a cancellation) is closed, so the next
        pipeline reconnects rather than reading a stale reply.
        """
        client = self._client
        assert isinstance(client, Redis)  # self._direct
        connection = self._connection
        if connection is None:
            connection = self._connection = await client.connection_pool.get_connection()
        try:
            await connection.send_packed_command(
                connection.pack_commands([args for args, _, _ in commands]), check_health=False
            )
            results: list[Any] = []
            for args, options, _ in commands:
                try:
                    results.append(await client.parse_response(connection, args[0], **options))
                except ResponseError as error:
                    results.append(error)
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        return results

    def _again(self, batch: list[_Queued], error: BaseException) -> list[_Queued]:
        now = asyncio.get_running_loop().time()
        again: list[_Queued] = []
        for queued in batch:
            if queued.future.done():
                continue
            if now >= queued.give_up_at:
                queued.future.set_exception(unavailable(error, f"sending {queued.args[0]}"))
            else:
                again.append(queued)
        return again

    def fail_pending(self, error: BaseException | None = None) -> None:
        """Fail (or cancel) every queued command: the owner is closing."""
        batch, self._queue = self._queue, []
        for queued in batch:
            if queued.future.done():
                continue
            if error is None:
                queued.future.cancel()
            else:
                queued.future.set_exception(error)
        self._idle.set()
