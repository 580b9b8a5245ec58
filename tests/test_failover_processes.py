"""Provider processes killed and paused: nothing lost, nothing answered twice (invariants 2-4)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, Broker
from tests.helpers import one_question, pick

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


class ProviderProcess:
    def __init__(self, url: str, namespace: str, name: str, label: str, delay: float, lease_ttl: float) -> None:
        args = [sys.executable, "-m", "tests.provider_process", url, namespace, name, label, str(delay), str(lease_ttl)]
        self.process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    async def expect(self, word: str, timeout: float = 10) -> str:
        loop = asyncio.get_running_loop()

        def read_until() -> str:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.lines.append(line.strip())
                if line.startswith(word):
                    return line.strip()
            raise AssertionError(f"process ended before {word}: {self.lines}")

        return await asyncio.wait_for(loop.run_in_executor(None, read_until), timeout)

    async def finish(self, timeout: float = 10) -> list[str]:
        """Every line the process prints until it exits by itself."""
        assert self.process.stdout is not None
        rest = await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(None, self.process.stdout.read), timeout
        )
        self.lines.extend(line.strip() for line in rest.splitlines())
        return self.lines

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
async def spawn(redis_server, namespace) -> AsyncIterator[Callable[..., ProviderProcess]]:
    started: list[ProviderProcess] = []

    def start(name: str, label: str, delay: float = 0.0, lease_ttl: float = 1.0) -> ProviderProcess:
        process = ProviderProcess(redis_server.url, namespace, name, label, delay, lease_ttl)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def labelled() -> AskUserQuestionRequest:
    return one_question("from-a", "from-b")


async def held_with_a_standby(
    spawn: Callable[..., ProviderProcess], asking: Broker, *, delay: float, asks: int
) -> tuple[ProviderProcess, ProviderProcess, list[asyncio.Task[AskUserQuestionAnswer]]]:
    """Process a holds the lease (answering each ask after ``delay`` s), b stands by, and ``asks`` asks have
    reached a: the two processes and the asks' tasks."""
    holder = spawn("a", "from-a", delay=delay)
    await holder.expect("HOLDING")
    standby = spawn("b", "from-b")
    await standby.expect("STANDBY")
    tasks = [asyncio.create_task(asking.ask(labelled(), timeout=30)) for _ in range(asks)]
    for _ in range(asks):
        await holder.expect("GOT")
    return holder, standby, tasks


async def answered_after(
    holder: ProviderProcess, signum: int, standby: ProviderProcess, asks: list[asyncio.Task[AskUserQuestionAnswer]]
) -> list[AskUserQuestionAnswer]:
    """The holder sent ``signum``: the standby takes the lease, and the asks' answers."""
    holder.signal(signum)
    await standby.expect("HOLDING")
    return await asyncio.gather(*asks)


async def answered_once_each(redis, keys, count: int) -> None:
    audit = await redis.xrange(keys.audit)
    answered = [f["rid"] for _, f in audit if f["event"] == "answered"]
    assert len(answered) == count and len(set(answered)) == count


async def test_kill_9_of_the_holder_loses_no_question(make_broker, spawn, redis):
    asking = await make_broker()
    # the holder receives them, and never answers in time
    holder, standby, asks = await held_with_a_standby(spawn, asking, delay=3600, asks=20)
    assert await answered_after(holder, signal.SIGKILL, standby, asks) == [pick("from-b")] * 20
    await answered_once_each(redis, asking.keys, 20)


async def test_a_paused_holder_is_fenced_when_it_wakes(make_broker, spawn, redis):
    asking = await make_broker()
    holder, standby, asks = await held_with_a_standby(spawn, asking, delay=1.5, asks=5)
    # stopped past its 1 s lease, before its 1.5 s answers
    assert await answered_after(holder, signal.SIGSTOP, standby, asks) == [pick("from-b")] * 5
    holder.signal(signal.SIGCONT)
    lines = await holder.finish()
    refused = [line for line in lines if line.startswith("REFUSED")]
    assert len(refused) == 5 and all(line.endswith("LEASE_LOST") for line in refused)
    assert "FENCED LEASE_LOST" in lines
    assert not [line for line in lines if line.startswith("ANSWERED")]
    await answered_once_each(redis, asking.keys, 5)
