"""What stops a quickstart's processes and removes its keys when ``qbroker quickstart`` itself is killed.

A signal quickstart can catch (Ctrl-C, SIGTERM, the SIGHUP of a closed terminal) lets it stop
everything itself. SIGKILL, a crash or the OOM killer do not: its children live in sessions of
their own and would run on, and its private directory (the signing key) would stay. So quickstart
first starts this guard, in a session of its own too, reading a pipe only quickstart writes to:
each process it starts (``pid N``), the directory to remove (``dir PATH``), and ``done`` once it
stopped them itself. The pipe ending without ``done`` means quickstart died: the guard stops the
processes, last started first (the page, the worker and the gateway before the Redis they use),
and removes the directory.

Where the system has pidfds (Linux 5.3+), each process is held by one from the moment it is named,
so a pid reused after its process ended is never signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TextIO

__all__ = ["Guard", "guarding", "main"]

_STOP_S = 5.0
"""how long each process has to stop on SIGTERM before SIGKILL"""


class Guard:
    """Quickstart's end of the pipe."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    async def _tell(self, line: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(line.encode() + b"\n")
        await self._process.stdin.drain()

    async def watch(self, pid: int) -> None:
        """Have ``pid`` stopped if quickstart dies (call it right after starting the process)."""
        await self._tell(f"pid {pid}")

    async def remove(self, directory: Path) -> None:
        """Have ``directory`` removed if quickstart dies."""
        await self._tell(f"dir {directory}")

    async def done(self) -> None:
        """Quickstart stopped everything itself: the guard leaves without touching anything."""
        with contextlib.suppress(OSError):
            await self._tell("done")
        assert self._process.stdin is not None
        self._process.stdin.close()
        await self._process.wait()


@contextlib.asynccontextmanager
async def guarding() -> AsyncIterator[Guard]:
    """A guard for the processes and the directory named to it; told ``done`` on a clean exit."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.operating.quickstart.guard",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    guard = Guard(process)
    try:
        yield guard
    finally:
        await guard.done()


class _Watched:
    """One process to stop: by pidfd where there are pidfds, else by pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):  # already gone, or no pidfds in this kernel
                self.fd = os.pidfd_open(pid)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(OSError):
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signum)
            else:
                os.kill(self.pid, signum)

    def wait(self, timeout: float) -> bool:
        """Whether the process ended within ``timeout`` seconds."""
        if self.fd is not None:
            poll = select.poll()
            poll.register(self.fd, select.POLLIN)  # readable once the process has ended
            return bool(poll.poll(timeout * 1000))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # no pidfd: nothing to block on for a process not our child
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.05)
        return False


def _stop(watched: list[_Watched]) -> None:
    for process in reversed(watched):
        process.signal(signal.SIGTERM)
        if not process.wait(_STOP_S):
            process.signal(signal.SIGKILL)
            process.wait(_STOP_S)


def watch(lines: TextIO) -> int:
    """Read the pipe until ``done`` (0: nothing to do) or its end (quickstart died: stop, remove; 1)."""
    watched: list[_Watched] = []
    directories: list[str] = []
    for line in lines:
        kind, _, value = line.rstrip("\n").partition(" ")
        if kind == "done":
            return 0
        if kind == "pid":
            watched.append(_Watched(int(value)))
        elif kind == "dir":
            directories.append(value)
    _stop(watched)
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)
    return 1


def main() -> int:
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # only the pipe's end tells it to act
    return watch(sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
