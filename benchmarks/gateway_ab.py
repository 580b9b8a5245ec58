"""Gateways from several source trees side by side: which change took time off an ask through the gateway.

python -m benchmarks.gateway_ab NAME=TREE [NAME=TREE ...] [--probes 1500] [--rounds 3]

One private redis-server and one provider (in this process); a ``qbroker gateway`` per TREE (a checkout,
say ``git worktree add /tmp/before HEAD~1``), each run from that tree with its own token. Each probe is
an ask answered at once, through every gateway in turn (each probe starting with the next one) and
then direct (``Broker.ask``), so all of them see the same machine at the same moment: on these shared
cores a run's absolute figures drift by a millisecond while the differences between trees in one run
hold better (the same tree twice still differs by up to 0.1 ms a round: compare over rounds). Per round
it prints the direct p50, each gateway's p50 and what it adds, and each gateway's CPU per probe.

``python -m benchmarks.gateway`` measures the gateway at scale (10 000 waiting asks); this one only
compares trees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec

from benchmarks.gateway import _NAMESPACE, _PROBE, _body, _cpu_s, _provider, _tokens
from benchmarks.keys import ENV, KEYS
from benchmarks.questions import yes_or_no
from broker import Broker
from workers.redis_server import RedisServer


async def _start(tree: Path, redis_url: str, tokens: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")}
    env.update(QBROKER_REDIS_URL=redis_url, QBROKER_NAMESPACE=_NAMESPACE, PYTHONPATH=str(tree))
    env.update(QBROKER_TRUSTED_KEYS=ENV["QBROKER_TRUSTED_KEYS"])
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", "gateway", "--tokens-file", str(tokens), "--port", "0",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=tree,
    )  # fmt: skip
    assert process.stderr is not None
    async with asyncio.timeout(30):
        async for raw in process.stderr:
            found = re.search(r"listening on (http://\S+)", raw.decode(errors="replace"))
            if found:
                break
        else:
            raise RuntimeError(f"the gateway of {tree} ended before it listened")

    async def drain() -> None:
        assert process.stderr is not None
        async for _ in process.stderr:
            pass

    asyncio.get_running_loop().create_task(drain())
    return process, found.group(1)


async def compare(trees: dict[str, Path], probes: int, rounds: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="qb-gateway-ab-"))
    redis = RedisServer(tmp / "redis").start()
    tokens = _tokens(tmp / "tokens", len(trees))  # a token each: one agent id per gateway
    gateways: dict[str, tuple[asyncio.subprocess.Process, str, dict[str, str]]] = {}
    try:
        for n, (name, tree) in enumerate(trees.items()):
            process, base = await _start(tree, redis.url, tmp / "tokens")
            headers = {"authorization": f"Bearer {tokens[n]}", "content-type": "application/json"}
            gateways[name] = (process, base, headers)
        async with (
            Broker(redis.url, _NAMESPACE, **KEYS) as providing,
            Broker(redis.url, _NAMESPACE, **KEYS) as direct,
            _provider(providing, asyncio.Event()),
            aiohttp.ClientSession() as session,
        ):
            for number in range(rounds):
                times: dict[str, list[float]] = {name: [] for name in [*gateways, "direct"]}
                cpu0 = {name: _cpu_s(process.pid) for name, (process, _, _) in gateways.items()}
                names = list(gateways)
                for n in range(probes):
                    # Each probe starts with the next gateway: whichever goes first after the direct ask
                    # was 0.1-0.16 ms slower, the same tree twice in one run showed it.
                    for name in names[n % len(names) :] + names[: n % len(names)]:
                        _, base, headers = gateways[name]
                        body = msgspec.json.encode(
                            {"request": _body(f"{_PROBE} {name} {n}?"), "coalesce": False, "wait": 60}
                        )
                        t0 = time.perf_counter()
                        async with session.post(base + "/v1/asks", data=body, headers=headers) as reply:
                            answered = msgspec.json.decode(await reply.read())
                        assert answered["state"] == "answered", answered
                        times[name].append((time.perf_counter() - t0) * 1000)
                    t0 = time.perf_counter()
                    await direct.ask(yes_or_no(f"{_PROBE} direct {n}?"), coalesce=False)
                    times["direct"].append((time.perf_counter() - t0) * 1000)
                warm = max(0, min(100, probes // 10))  # the first probes warm the connections
                p50 = {name: statistics.median(values[warm:]) for name, values in times.items()}
                cpu = {
                    name: (_cpu_s(process.pid) - cpu0[name]) * 1000 / probes
                    for name, (process, _, _) in gateways.items()
                }
                shown = "; ".join(
                    f"{name} {p50[name]:.3f} (+{p50[name] - p50['direct']:.3f}, CPU {cpu[name]:.3f})"
                    for name in gateways
                )
                print(f"round {number + 1}: direct p50 {p50['direct']:.3f} ms; {shown}", flush=True)
    finally:
        for process, _, _ in gateways.values():
            if process.returncode is None:
                process.terminate()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await process.wait()
        redis.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_ab", description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", metavar="NAME=TREE")
    parser.add_argument("--probes", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args(argv)
    trees: dict[str, Path] = {}
    for spec in options.trees:
        name, _, tree = spec.partition("=")
        if not name or not tree or not (Path(tree) / "workers").is_dir():
            parser.error(f"{spec!r}: give NAME=TREE, TREE a checkout of this project")
        trees[name] = Path(tree).resolve()
    print(
        f"{options.probes} probes a round through {', '.join(trees)} and direct, interleaved (p50 ms; CPU ms a probe)"
    )
    asyncio.run(compare(trees, options.probes, options.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
