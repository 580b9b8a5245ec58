"""Many agents asking through one ``qbroker gateway`` (issue 27's connection target).

python -m benchmarks.gateway [--clients 1000] [--asks-per-client 10] [--probes 200]

A private redis-server, a real ``qbroker gateway`` process with a token per client, and, in this
process, a provider. ``--clients`` HTTP clients (aiohttp, one connection each) each start
``--asks-per-client`` distinct asks and long-poll them; the provider leaves those waiting. With
all of them waiting, ``--probes`` asks answered at once are timed one after the other, through
the gateway (``POST /v1/asks`` with ``wait``) and directly through a ``Broker``, interleaved in
the same run. Then the provider answers the waiting asks (``--answer-after`` seconds after the
last one started) and every client collects its answers by long polling. It prints:

- the Redis connections the gateway holds (``CLIENT LIST``: every broker connection that is not
  this process's), at their most while the asks wait;
- p50/p99 of an ask answered at once, through the gateway and direct, and their difference;
- the gateway's RSS with everything waiting, and its CPU per ask over the whole run
  (start, long polls, answer), from ``/proc``.

Figures only: the tests assert behaviour, never times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import re
import resource
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from redis.asyncio import Redis

from benchmarks.keys import ENV, KEYS
from benchmarks.questions import YES, yes_or_no
from broker import Broker, PendingRequest
from workers.asking.gateway.tokens import TOKEN_PREFIX
from workers.redis_server import RedisServer

_NAMESPACE = "bench"
_PROBE = "probe"
_POLL = 20.0


def _body(text: str) -> dict[str, Any]:
    return {"questions": [{"id": "q1", "question": text, "options": [{"label": "yes"}, {"label": "no"}]}]}


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _tokens(path: Path, clients: int) -> list[str]:
    tokens = [TOKEN_PREFIX + secrets.token_urlsafe(32) for _ in range(clients + 1)]
    lines = [f"agent-{n} {hashlib.sha256(token.encode()).hexdigest()}\n" for n, token in enumerate(tokens)]
    path.write_text("".join(lines))
    path.chmod(0o600)
    return tokens


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found.group(1)) / 1024 if found else 0.0


async def _start_gateway(redis_url: str, tokens: Path, log: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")}
    env.update(QBROKER_REDIS_URL=redis_url, QBROKER_NAMESPACE=_NAMESPACE)
    env.update(QBROKER_TRUSTED_KEYS=ENV["QBROKER_TRUSTED_KEYS"])  # an asker: it verifies, never signs
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", "gateway", "--tokens-file", str(tokens), "--port", "0",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert process.stderr is not None
    seen: list[str] = []
    async with asyncio.timeout(30):
        async for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            seen.append(line)
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                break
        else:
            raise RuntimeError("the gateway ended:\n" + "\n".join(seen))

    async def drain() -> None:  # keep reading, so a chatty gateway never blocks on its pipe
        assert process.stderr is not None
        with log.open("ab") as out:
            async for raw in process.stderr:
                out.write(raw)

    asyncio.get_running_loop().create_task(drain())
    return process, found.group(1)


@contextlib.asynccontextmanager
async def _provider(broker: Broker, release: asyncio.Event) -> Any:
    """Probes are answered at once; the others once ``release`` is set."""

    async def later(pending: PendingRequest) -> None:
        await release.wait()
        await pending.answer(YES, by="bench")

    async with broker.provider("bench") as held, asyncio.TaskGroup() as tasks:

        async def serve() -> None:
            async for pending in held:
                if pending.request.questions[0].question.startswith(_PROBE):
                    await pending.answer(YES, by="bench")
                else:
                    tasks.create_task(later(pending))

        server = tasks.create_task(serve())
        try:
            yield
        finally:
            release.set()
            server.cancel()


async def _gateway_connections(admin: Any, own: set[str]) -> int:
    clients = await admin.client_list()
    return sum(1 for c in clients if c.get("name", "").startswith("qb-") and c["name"] not in own)


async def _client(
    session: aiohttp.ClientSession, base: str, token: str, n: int, asks: int, started: asyncio.Queue[None]
) -> int:
    """One agent: starts ``asks`` asks, then long-polls each until answered; returns how many were."""
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    ids = []
    for m in range(asks):
        body = {"request": _body(f"Question {n}.{m}?"), "coalesce": False}
        async with session.post(base + "/v1/asks", data=msgspec.json.encode(body), headers=headers) as reply:
            assert reply.status == 202, await reply.text()
            ids.append((await reply.json())["id"])
        started.put_nowait(None)
    answered = 0
    for ask_id in ids:
        while True:
            url = f"{base}/v1/asks/{ask_id}"
            async with session.get(url, params={"wait": str(_POLL)}, headers=headers) as reply:
                body = await reply.json()
            if body["state"] != "pending":
                answered += body["state"] == "answered"
                break
    return answered


def _percentiles(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def measure(clients: int, per_client: int, probes: int, answer_after: float) -> dict[str, float]:
    _raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="qb-gateway-bench-"))
    redis = RedisServer(tmp / "redis").start()
    tokens_path = tmp / "tokens"
    tokens = _tokens(tokens_path, clients)
    gateway, base = await _start_gateway(redis.url, tokens_path, tmp / "gateway.log")
    release = asyncio.Event()
    total = clients * per_client
    figures: dict[str, float] = {}
    try:
        async with (
            Broker(redis.url, _NAMESPACE, **KEYS) as providing,
            Broker(redis.url, _NAMESPACE, **KEYS) as direct,
            _provider(providing, release),
        ):
            admin = Redis.from_url(redis.url, decode_responses=True)
            own = {f"qb-{providing.client_id}", f"qb-{direct.client_id}"}
            figures["connections_idle"] = await _gateway_connections(admin, own)
            cpu0 = _cpu_s(gateway.pid)
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=None, sock_read=_POLL + 30)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                started: asyncio.Queue[None] = asyncio.Queue()
                began = time.perf_counter()
                agents = [
                    asyncio.create_task(_client(session, base, tokens[n], n, per_client, started))
                    for n in range(clients)
                ]
                async with asyncio.timeout(max(120, total / 50)):
                    for _ in range(total):
                        await started.get()
                figures["start_s"] = time.perf_counter() - began
                figures["connections_waiting"] = await _gateway_connections(admin, own)
                figures["rss_mib"] = _rss_mib(gateway.pid)
                # Probes under load, gateway and direct interleaved so that both see the same machine.
                # As GatewayClient sends a start: the body encoded by msgspec.
                probe_headers = {"authorization": f"Bearer {tokens[clients]}", "content-type": "application/json"}
                via, plain = [], []
                for n in range(probes):
                    body = {"request": _body(f"{_PROBE} {n}?"), "coalesce": False, "wait": 60}
                    t0 = time.perf_counter()
                    # Read to the end, as a client must for its answer (an unread reply also costs aiohttp
                    # its keep-alive connection: each probe would connect anew).
                    async with session.post(
                        base + "/v1/asks", data=msgspec.json.encode(body), headers=probe_headers
                    ) as reply:
                        answered = msgspec.json.decode(await reply.read())
                    assert reply.status == 200 and answered["state"] == "answered", answered
                    via.append((time.perf_counter() - t0) * 1000)
                    t0 = time.perf_counter()
                    await direct.ask(yes_or_no(f"{_PROBE} direct {n}?"), coalesce=False)
                    plain.append((time.perf_counter() - t0) * 1000)
                figures["connections_max"] = max(figures["connections_waiting"], await _gateway_connections(admin, own))
                figures["via_p50"], figures["via_p99"] = _percentiles(via)
                figures["direct_p50"], figures["direct_p99"] = _percentiles(plain)
                fifth = max(1, probes // 5)
                added = [
                    statistics.median(via[i : i + fifth]) - statistics.median(plain[i : i + fifth])
                    for i in range(0, fifth * min(5, probes), fifth)
                ]
                figures["added_min"], figures["added_max"] = min(added), max(added)
                await asyncio.sleep(max(0.0, answer_after - (time.perf_counter() - began - figures["start_s"])))
                answered_at = time.perf_counter()
                release.set()
                async with asyncio.timeout(max(120, total / 50)):
                    results = await asyncio.gather(*agents)
                figures["answer_s"] = time.perf_counter() - answered_at
                figures["answered"] = sum(results)
            figures["cpu_per_ask_ms"] = (_cpu_s(gateway.pid) - cpu0) * 1000 / (total + probes)
            figures["rss_end_mib"] = _rss_mib(gateway.pid)
            await admin.aclose()
    finally:
        if gateway.returncode is None:
            gateway.terminate()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await gateway.wait()
            if gateway.returncode is None:
                gateway.kill()
        redis.kill()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--asks-per-client", type=int, default=10)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--answer-after", type=float, default=2.0, metavar="SECONDS")
    options = parser.parse_args(argv)
    total = options.clients * options.asks_per_client
    f = asyncio.run(measure(options.clients, options.asks_per_client, options.probes, options.answer_after))
    print(f"{total} waiting asks from {options.clients} clients through one gateway (started in {f['start_s']:.1f} s)")
    print(f"  gateway Redis connections: {f['connections_max']:.0f} at most (idle {f['connections_idle']:.0f},"
          f" with every ask waiting {f['connections_waiting']:.0f}; target at most 16)")  # fmt: skip
    print(f"  ask answered at once, through the gateway: p50 {f['via_p50']:.2f} ms, p99 {f['via_p99']:.2f} ms")
    print(f"  ask answered at once, direct (Broker): p50 {f['direct_p50']:.2f} ms, p99 {f['direct_p99']:.2f} ms")
    print(f"  the gateway adds {f['via_p50'] - f['direct_p50']:.2f} ms to p50 ({f['via_p50'] / f['direct_p50']:.2f}x;"
          " target at most 1 ms)")  # fmt: skip
    print(f"  added p50 in each fifth of the probes: {f['added_min']:.2f} to {f['added_max']:.2f} ms")
    print(f"  gateway RSS {f['rss_mib']:.0f} MiB with every ask waiting ({f['rss_end_mib']:.0f} MiB at the end)")
    print(f"  gateway CPU per ask {f['cpu_per_ask_ms']:.2f} ms (start, long polls, answer)")
    print(f"  answered {f['answered']:.0f} of {total} within {f['answer_s']:.1f} s of the provider answering")
    return 0 if f["answered"] == total else 1


if __name__ == "__main__":
    sys.exit(main())
