"""A soak of keyed askers restarted while `qbroker worker` runs and a provider answers (issue 23, Proof).

For about 45 s, four slots each run `qbroker ask --key` processes one key after another; each question's
first option is its own token. While a question is pending its process is SIGKILLed at a random (seeded)
moment and the same command run again, up to twice per key; the maintenance worker sweeps every second and
a provider process answers each card after 1.5 s. At the end: every key answered with its own token, each
request asked once and answered once (0 lost, 0 answered twice, 0 misrouted), none expired or withdrawn,
no durable key left. The figures (asks, restarts, re-attaches, time) are printed (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass

import pytest
from redis.asyncio import Redis

from broker._keys import Keys
from tests.workers.procs import Worker, env_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SLOTS = 4
SECONDS = 45.0
RESTARTS_PER_KEY = 2


@dataclass
class Figures:
    asks: int = 0
    answered: int = 0
    restarts: int = 0
    re_attaches: int = 0
    misrouted: int = 0
    failed: int = 0
    audit_answered: int = 0
    answered_twice: int = 0
    asked_twice: int = 0
    lost: int = 0
    other_ends: int = 0
    durable_left: int = 0
    maintenance_runs: int = 0
    seconds: float = 0.0


async def run_asker(url: str, namespace: str, args: tuple[str, ...]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env_for(url, namespace),
    )  # fmt: skip


async def test_keyed_askers_restarted_while_housekeeping_runs_lose_nothing(redis_server, namespace):
    keys = Keys(namespace)
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    rng = random.Random(23)
    figures = Figures()
    failures: list[str] = []
    started = time.monotonic()
    workers: list[Worker] = []
    try:
        housekeeping = await Worker.start("worker", "--interval", "1", "--arq-redis-url", redis_server.url,
                                          "--queue-name", f"arq:{namespace}", url=redis_server.url,
                                          namespace=namespace)  # fmt: skip
        workers.append(housekeeping)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.keyed_provider", redis_server.url, namespace, "ui", "1.5", "2.0", "0", "0",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=env_for(redis_server.url, namespace),
        )  # fmt: skip
        answering = Worker(process)
        workers.append(answering)
        await answering.expect(r"^HOLDING")

        async def pending(agent: str, key: str) -> bool:
            rid = await redis.get(keys.durable(agent, key))
            return rid is not None and await redis.hget(keys.request(rid), "state") == "pending"

        async def one_key(slot: int, n: int) -> None:
            agent, key, token = f"soak-{slot}", f"key-{slot}-{n}", f"tok-{slot}-{n}"
            args = ("ask", "--agent", agent, "--key", key, "-q", f"deploy {slot}.{n}?", "-o", token, "-o", "other",
                    "--detach-grace", "30", "--timeout", "100")  # fmt: skip
            figures.asks += 1
            for restart in range(RESTARTS_PER_KEY + 1):
                asker = await run_asker(redis_server.url, namespace, args)
                output = asyncio.ensure_future(asker.communicate())
                if restart < RESTARTS_PER_KEY and rng.random() < 0.7:
                    await asyncio.wait([output], timeout=rng.uniform(0.8, 2.0))
                    # only mid-question: a process killed after it received its answer leaves nothing to collect
                    if not output.done() and await pending(agent, key):
                        asker.kill()
                        await output
                        figures.restarts += 1
                        continue
                out, err = await asyncio.wait_for(output, 60)
                if asker.returncode != 0:
                    figures.failed += 1
                    failures.append(f"{key}: {asker.returncode} {err.decode()[-300:]}")
                elif [item["selected"] for item in json.loads(out)["answers"]] != [[token]]:
                    figures.misrouted += 1
                else:
                    figures.answered += 1
                return

        async def slot(number: int) -> None:
            n = 0
            while time.monotonic() - started < SECONDS:
                await one_key(number, n)
                n += 1

        await asyncio.gather(*(slot(i) for i in range(SLOTS)))
        figures.seconds = round(time.monotonic() - started, 1)
        figures.maintenance_runs = await redis.xlen(f"{keys.prefix}maintenance")
    finally:
        for worker in workers:
            await worker.stop()

    audit = [fields for _, fields in await redis.xrange(keys.audit)]
    asklog = [fields for _, fields in await redis.xrange(keys.asklog)]
    figures.durable_left = len(await redis.keys(f"{keys.prefix}key:*"))
    await redis.aclose()
    answered = Counter(f["rid"] for f in audit if f.get("event") == "answered")
    asked = Counter(f["rid"] for f in asklog if f.get("event") == "asked")
    figures.audit_answered = sum(answered.values())
    figures.answered_twice = sum(n - 1 for n in answered.values() if n > 1)
    figures.asked_twice = len(asked) - figures.asks  # a restart asked anew instead of re-attaching
    figures.lost = len(set(asked) - set(answered)) + (figures.asks - figures.answered - figures.misrouted)
    figures.re_attaches = sum(1 for f in asklog if f.get("event") == "attached")
    figures.other_ends = sum(1 for f in audit if f.get("event") in ("expired", "withdrawn", "cancelled"))
    print("keyed soak:", json.dumps(asdict(figures)))
    assert failures == [], failures
    assert figures.restarts >= 10 and figures.re_attaches >= 5 and figures.maintenance_runs >= 20, figures
    assert figures.answered == figures.asks == len(asked) == len(answered), figures
    assert (figures.lost, figures.answered_twice, figures.misrouted, figures.asked_twice) == (0, 0, 0, 0), figures
    assert figures.other_ends == 0 and figures.durable_left == 0, figures
