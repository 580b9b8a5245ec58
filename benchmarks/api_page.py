"""The web API's first page with many questions pending (issue 27).

python -m benchmarks.api_page [--questions 100000] [--repeats 50]

A private redis-server, a ``qbroker web`` process and one asking broker that leaves
``--questions`` distinct questions pending. Once the web server shows them all (counted by
walking the pages), it prints, in milliseconds over HTTP on this machine (medians of
``--repeats``): ``GET /api/requests?limit=100`` (the first page), the same with a filter
(``priority=urgent``), a page from the middle (``after=`` a cursor), and the unpaged
``GET /api/requests`` (every request, as before paging; median of 3) with its size.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.keys import KEYS
from benchmarks.page import _TOKEN, _start_web
from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest, Broker
from workers.redis_server import RedisServer

_HEADERS = {"Authorization": f"Bearer {_TOKEN}"}
_OPTIONS = (AskUserQuestionOption(label="yes"), AskUserQuestionOption(label="no"))
_PRIORITIES = ("normal",) * 8 + ("urgent", "low")


def _request(n: int) -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id="q", question=f"Question {n}?", options=_OPTIONS)
    return AskUserQuestionRequest(questions=(item,), priority=_PRIORITIES[n % len(_PRIORITIES)])


async def _shown(client: httpx.AsyncClient, count: int, within: float) -> str:
    """Walk the pages until ``count`` requests were seen; returns a cursor from the middle."""
    seen, cursor, middle = 0, "", ""
    async with asyncio.timeout(within):
        while seen < count:
            params = {"limit": "1000"} | ({"after": cursor} if cursor else {})
            try:
                page = (await client.get("/api/requests", params=params)).json()
            except httpx.TransportError:  # a kept-alive connection closed while this loop was busy asking
                continue
            seen += len(page["requests"])
            if page["next"]:
                cursor = page["next"]
                middle = middle or (cursor if seen >= count // 2 else "")
            else:
                await asyncio.sleep(0.5)
    return middle or cursor


async def _median_ms(client: httpx.AsyncClient, params: dict[str, str], repeats: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        response = await client.get("/api/requests", params=params)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text[:500]
        size = len(response.content)
    return statistics.median(times), size


async def measure(questions: int, repeats: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="qb-api-page-bench-"))
    redis = RedisServer(tmp / "redis").start()
    web, url = _start_web(redis.url, "bench", tmp)
    try:
        async with (
            Broker(redis.url, "bench", client_ttl=3600.0, **KEYS) as broker,
            httpx.AsyncClient(base_url=url, headers=_HEADERS, timeout=120) as client,
        ):
            asks = [asyncio.create_task(broker.ask(_request(n), abort=None)) for n in range(questions)]
            started = time.perf_counter()
            middle = await _shown(client, questions, within=600)
            shown_s = time.perf_counter() - started
            figures: dict[str, float] = {"shown_s": shown_s}
            figures["first_ms"], figures["first_b"] = await _median_ms(client, {"limit": "100"}, repeats)
            figures["urgent_ms"], _ = await _median_ms(client, {"limit": "100", "priority": "urgent"}, repeats)
            figures["middle_ms"], _ = await _median_ms(client, {"limit": "100", "after": middle}, repeats)
            figures["all_ms"], figures["all_b"] = await _median_ms(client, {}, 3)
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
        return figures
    finally:
        web.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            web.wait(10)
        web.kill()
        redis.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_page", description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=50)
    options = parser.parse_args(argv)
    f = asyncio.run(measure(options.questions, options.repeats))
    print(f"{options.questions} pending questions (shown by the web server after {f['shown_s']:.1f} s):")
    print(f"  GET /api/requests?limit=100 (first page): {f['first_ms']:.1f} ms, {f['first_b'] / 1024:.0f} KiB"
          " (target under 50 ms)")  # fmt: skip
    print(f"  ... &priority=urgent: {f['urgent_ms']:.1f} ms; a page from the middle (after=): {f['middle_ms']:.1f} ms")
    print(f"  GET /api/requests (everything, unpaged): {f['all_ms']:.0f} ms, {f['all_b'] / 1024 / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
