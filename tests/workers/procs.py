"""Run ``qbroker`` as a real process and follow its stderr."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from broker import PendingRequest, Provider
from tests.helpers import SIGNING_KEY

T = TypeVar("T")


def env_for(url: str, namespace: str, **extra: str) -> dict[str, str]:
    """The environment of a qbroker process: the tests' Redis, namespace and keys, and ``extra``."""
    # Nor Claude Code's: a hook under test decides interactive or headless by CLAUDE_CODE_ENTRYPOINT.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QBROKER_", "CLAUDE_CODE_"))}
    env.update(
        QBROKER_REDIS_URL=url,
        QBROKER_NAMESPACE=namespace,
        QBROKER_SIGNING_KEY=SIGNING_KEY.to_text(),
        QBROKER_TRUSTED_KEYS=SIGNING_KEY.public_text,
    )
    env.update(extra)
    return env


async def start_module(module: str, *args: str, url: str, namespace: str) -> asyncio.subprocess.Process:
    """``python -m module args`` as an asking process of the tests' Redis and namespace, its output piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env_for(url, namespace),
    )  # fmt: skip


async def start_qbroker(
    *args: str, env: dict[str, str], stdin: bytes | None = None, cwd: Path | None = None
) -> asyncio.subprocess.Process:
    """``qbroker args`` in ``env`` (and ``cwd``), its output piped, and its input too when there is ``stdin`` to send."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
    )


async def finished(
    process: asyncio.subprocess.Process, stdin: bytes | None = None, limit: float = 20.0
) -> tuple[int, bytes, bytes]:
    """Send ``stdin`` and wait for the end: (status, stdout, stderr). Killed if it runs past ``limit`` seconds."""
    try:
        out, err = await asyncio.wait_for(process.communicate(stdin), limit)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out, err


async def run_qbroker(
    *args: str, url: str, namespace: str, stdin: bytes | None = None, limit: float = 20.0
) -> tuple[int, bytes, bytes]:
    """Run to completion; returns (status, stdout, stderr)."""
    process = await start_qbroker(*args, env=env_for(url, namespace), stdin=stdin)
    return await finished(process, stdin, limit)


class FollowedProcess:
    """A process whose lines on one stream are collected as they come."""

    def __init__(self, process: asyncio.subprocess.Process, stream: asyncio.StreamReader | None) -> None:
        assert stream is not None
        self.process = process
        self.lines: list[str] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
            self._changed.set()
        self._changed.set()

    async def until(self, found: Callable[[], T | None], what: str) -> T:
        """Wait until ``found()`` returns something other than None; an AssertionError when the stream
        ends first (the process exited), ``what`` naming what was awaited."""
        while True:
            if (result := found()) is not None:
                return result
            if self._reader.done():
                raise AssertionError(f"exited without {what}; its lines:\n" + "\n".join(self.lines))
            self._changed.clear()
            await self._changed.wait()

    async def stopped_reading(self) -> None:
        """Wait until the stream ends."""
        await self._reader


class Worker(FollowedProcess):
    """A long-running ``qbroker`` process whose stderr lines are collected as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        super().__init__(process, process.stderr)

    @classmethod
    async def start(cls, *args: str, url: str, namespace: str, **env: str) -> Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "workers",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env_for(url, namespace, **env),
        )
        return cls(process)

    async def expect(self, pattern: str, *, within: float = 15.0, after: int = 0) -> re.Match[str]:
        """Wait for a stderr line (from index ``after``) matching ``pattern``."""
        regex = re.compile(pattern)

        def search() -> re.Match[str] | None:
            return next((found for line in self.lines[after:] if (found := regex.search(line))), None)

        try:
            return await asyncio.wait_for(self.until(search, repr(pattern)), within)
        except TimeoutError:
            raise AssertionError(f"no {pattern!r} in time; stderr:\n" + "\n".join(self.lines)) from None

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def stop(self) -> Any:
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGCONT)
                self.process.terminate()
            except ProcessLookupError:
                pass
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        await self.stopped_reading()
        return self.process.returncode


@contextlib.asynccontextmanager
async def auto_answering(rules: str, rules_file: Path, url: str, namespace: str) -> AsyncIterator[Worker]:
    """``qbroker auto`` answering by ``rules`` (TOML, written to ``rules_file``), once it holds the lease;
    stopped on exit."""
    await asyncio.to_thread(rules_file.write_text, rules)
    worker = await Worker.start("auto", "--rules", str(rules_file), url=url, namespace=namespace)
    try:
        await worker.expect("holding the lease")
        yield worker
    finally:
        await worker.stop()


async def delivered_to(provider: Provider, process: asyncio.Task[Any], what: str) -> PendingRequest:
    """The next request delivered to ``provider``; an AssertionError if ``process`` (``what``) ends first,
    or 15 s pass."""
    delivery = asyncio.ensure_future(anext(aiter(provider)))
    await asyncio.wait({process, delivery}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
    if not delivery.done():
        delivery.cancel()
        raise AssertionError(f"not delivered; {what} ended with {process.result() if process.done() else None}")
    return delivery.result()
