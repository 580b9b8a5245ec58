"""One connection for every command a process issues: auto-pipelining and the scripts.

Commands issued while a pipeline is in flight are sent together in the next one, so a
process holds one command connection however many asks it runs at once, and a burst of
N commands costs about one round trip rather than N.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

__all__ = ["REDIS_DOWN", "SCRIPTS", "Commands", "Script", "is_transient"]

log = logging.getLogger(__name__)


REDIS_DOWN = (ConnectionError, TimeoutError, OSError)
_TRANSIENT_REPLIES = ("UNBLOCKED", "READONLY", "MASTERDOWN", "LOADING", "TRYAGAIN", "CLUSTERDOWN")


def is_transient(error: BaseException) -> bool:
    """A broken connection, or a reply meaning "this server cannot serve you right now"
    (a master demoted under a blocked read, a replica, a server still loading its data)."""
    if isinstance(error, REDIS_DOWN):
        return True
    return isinstance(error, ResponseError) and str(error).startswith(_TRANSIENT_REPLIES)


class Script:
    """A Lua script from ``broker/scripts``; run by SHA, reloaded after NOSCRIPT.

    Each starts with ``#!lua`` so that Redis 7 refuses it on a read-only replica (READONLY,
    which a Sentinel client turns into a reconnect to the master) rather than answering
    from the replica's state. ``plain`` is the same script without that line, for fakeredis,
    which does not know it.
    """

    __slots__ = ("name", "plain", "plain_sha", "sha", "source")

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text()
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        self.plain = self.source.removeprefix("#!lua\n")
        self.plain_sha = hashlib.sha1(self.plain.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.name!r})"


SCRIPTS = {
    name: Script(name)
    for name in (
        "ask",
        "deliver",
        "settle",
        "withdraw",
        "deadletter",
        "lease_acquire",
        "lease_renew",
        "lease_release",
        "agent_register",
        "agent_heartbeat",
    )
}


class Commands:
    """Sends commands over one client connection, batching whatever is queued."""

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._plain_scripts = type(client).__module__.startswith("fakeredis")
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    async def call(self, *args: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((args, future))
        self._wakeup.set()
        self._idle.clear()
        return await future

    async def script(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        source, sha = (script.plain, script.plain_sha) if self._plain_scripts else (script.source, script.sha)
        try:
            return await self.call("EVALSHA", sha, len(keys), *keys, *args)
        except NoScriptError:
            # Redis restarted or flushed its script cache; EVAL caches the script again.
            return await self.call("EVAL", source, len(keys), *keys, *args)

    async def run(self) -> None:
        """Send queued commands until cancelled; the owner runs this in its task group."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._queue = self._queue, []
            if batch:
                await self._send(batch)
            if not self._queue:
                self._idle.set()

    async def drain(self) -> None:
        """Wait until every queued command has been sent and answered."""
        await self._idle.wait()

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for args, _ in batch:
            pipe.execute_command(*args)
        try:
            results = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as error:  # a connection failure fails the whole batch
            log.warning("redis pipeline of %d commands failed: %s", len(batch), error)
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    def fail_pending(self) -> None:
        """Cancel every queued command (on shutdown)."""
        batch, self._queue = self._queue, []
        for _, future in batch:
            future.cancel()
