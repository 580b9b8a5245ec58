"""A Redis Cluster master killed under load: its replica takes over and every ask still ends (issue 11 case 16).

Three masters with one replica each and a 1 s node timeout; a provider in its own process on
``redis+cluster://``; 16 asks at a time from this process; the master serving the namespace's
slot is kill -9'd mid-run. The replica must be promoted, the provider process must still be
alive and serving, and every ask must end (answered, or a coded UserQuestionError) within
ASK_BOUND seconds of its start: none hangs. And since the namespace was unreachable for far
less than the broker's ``unavailable_after`` (30 s) and a provider process existed all along,
no ask may fail BROKER_UNAVAILABLE or NO_PROVIDER: a failover is waited out, as with Sentinel.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import Broker, UserQuestionError
from broker._keys import Keys
from tests.cluster import RedisClusterFixture
from tests.helpers import KEYS, one_question, pick

ROOT = Path(__file__).resolve().parent.parent
ASK_BOUND = 30.0  # seconds from an ask's start to its end, whatever happened meanwhile
CONCURRENCY = 16

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[RedisClusterFixture]:
    cluster = RedisClusterFixture(tmp_path / "cluster", replicas=1, node_timeout=1000).start()
    yield cluster
    cluster.kill()


class ProviderProcess:
    """tests/provider_process.py in its own process; stdout and stderr go to files (no pipe to fill)."""

    def __init__(self, directory: Path, url: str, namespace: str, lease_ttl: float) -> None:
        self.out, self.err = directory / "provider.out", directory / "provider.err"
        args = [sys.executable, "-m", "tests.provider_process", url, namespace, "ui", "yes", "0.01", str(lease_ttl)]
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=err)

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines()

    def report(self) -> str:
        status = "alive" if self.process.poll() is None else f"exited with {self.process.returncode}"
        return f"provider {status}; stdout tail: {self.lines()[-5:]}; stderr tail:\n{self.err.read_text()[-3000:]}"

    async def expect(self, word: str, within: float) -> None:
        deadline = time.monotonic() + within
        while not any(line.startswith(word) for line in self.lines()):
            assert self.process.poll() is None, f"no {word}: {self.report()}"
            assert time.monotonic() < deadline, f"no {word} in time: {self.report()}"
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


async def test_a_masters_kill_9_under_load_ends_every_ask_and_the_provider_keeps_serving(
    replicated_cluster: RedisClusterFixture, tmp_path: Path
) -> None:
    cluster = replicated_cluster
    namespace = "failover"
    provider = ProviderProcess(tmp_path, cluster.url, namespace, lease_ttl=5.0)
    outcomes: collections.Counter[str] = collections.Counter()
    slowest = 0.0
    stop = asyncio.Event()
    workers: list[asyncio.Task[None]] = []
    try:
        await provider.expect("HOLDING", within=30)
        async with Broker(cluster.url, namespace, **KEYS) as asking:

            async def one_ask() -> None:
                nonlocal slowest
                started = time.monotonic()
                try:
                    assert await asking.ask(one_question()) == pick("yes")
                    outcomes["answered"] += 1
                except UserQuestionError as error:
                    outcomes[error.code] += 1
                    await asyncio.sleep(0.1)  # a failing ask is not retried in a tight loop
                except Exception as error:  # what must not escape an ask
                    outcomes[f"raw {type(error).__name__}: {error}"] += 1
                    await asyncio.sleep(0.1)
                slowest = max(slowest, time.monotonic() - started)

            async def asker() -> None:
                while not stop.is_set():
                    await one_ask()

            workers += [asyncio.create_task(asker()) for _ in range(CONCURRENCY)]
            while outcomes["answered"] < 200:  # under load before the kill
                assert not any(w.done() for w in workers), outcomes
                await asyncio.sleep(0.05)
            slot, old_port = cluster.kill_master_of(Keys(namespace).requests)
            killed = time.monotonic()
            killed_at = time.strftime("%H:%M:%S")
            new_port = await asyncio.to_thread(cluster.wait_failover, slot, old_port, 20.0)
            promoted_after = time.monotonic() - killed
            await asyncio.sleep(5)  # keep asking on the promoted replica
            stop.set()
            # each worker finishes the ask it is in; that ask must end within its bound
            _, hung = await asyncio.wait(workers, timeout=ASK_BOUND)
            for task in hung:
                task.cancel()
            provider_alive = provider.process.poll() is None
            after: collections.Counter[str] = collections.Counter()  # then a fresh batch must be answered
            batch = [asyncio.create_task(asking.ask(one_question(), timeout=20)) for _ in range(CONCURRENCY)]
            for result in await asyncio.gather(*batch, return_exceptions=True):
                if isinstance(result, UserQuestionError):
                    after[result.code] += 1
                else:
                    after["answered" if result == pick("yes") else repr(result)[:200]] += 1
    finally:
        stop.set()
        for task in workers:  # an exception left unretrieved crashes pytest (see tests/test_lost_replies.py)
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        provider.stop()

    summary = (
        f"master {old_port} killed at {killed_at}, port {new_port} promoted {promoted_after:.1f}s later; outcomes {dict(outcomes)}; slowest ask "
        f"{slowest:.1f}s; {len(hung)} of {CONCURRENCY} asks still waiting {ASK_BOUND:.0f}s after the stop; "
        f"after the failover {dict(after)}; {provider.report()}"
    )
    print(summary)
    assert new_port != old_port
    assert provider_alive, summary
    assert not hung, summary
    assert not [o for o in outcomes if o.startswith("raw ")], summary
    assert slowest <= ASK_BOUND, summary
    assert after == {"answered": CONCURRENCY}, summary
    assert not outcomes["BROKER_UNAVAILABLE"] and not outcomes["NO_PROVIDER"], summary
