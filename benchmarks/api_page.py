"""The web API's first page with many questions pending (issue 27).

python -m benchmarks.api_page [--questions 100000] [--agents 1000] [--repeats 50] [--runs 3]

A private redis-server, a ``qbroker web`` process and one asking broker that leaves
``--questions`` distinct questions pending, asked in turn by ``--agents`` agents. Once the web server
shows them all (counted by walking the pages), it prints, in milliseconds over HTTP on this machine
(medians of ``--repeats``, for each of ``--runs`` rounds: the machine is shared, so the figures swing):
``GET /api/requests?limit=100`` (the first page), the same with a filter (``priority=urgent``, and
``agent=`` one of the agents), a page from the middle (``after=`` a cursor), and the unpaged
``GET /api/requests`` (every request, as before paging; median of 3) with its size. Then the page
itself: the bytes of the first event of a page's stream (``GET /api/events``: the snapshot, the
first ``--page-window`` cards and the total) and, in headless Chromium, the time from opening the
signed-in page to its first card painted (median of ``--page-repeats`` reloads: by the page's clock, from
the navigation's start to the first frame with a card, and as Playwright sees it, its own round trips included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import async_playwright

from benchmarks.keys import KEYS
from benchmarks.page import _ARGS, _TOKEN, CHROMIUM, _start_web, sign_in, stop_web
from benchmarks.questions import OPTIONS
from broker import AskUserQuestionItem, AskUserQuestionRequest, Broker
from workers.redis_server import RedisServer

_HEADERS = {"Authorization": f"Bearer {_TOKEN}"}
_PRIORITIES = ("normal",) * 8 + ("urgent", "low")
_CHUNK = 5_000


def _request(n: int, agents: int) -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id="q", question=f"Question {n}?", options=OPTIONS)
    priority = _PRIORITIES[n % len(_PRIORITIES)]
    return AskUserQuestionRequest(questions=(item,), priority=priority, agent=f"agent-{n % agents}")


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


async def _total(client: httpx.AsyncClient) -> int:
    """How many requests the web server shows, as its stream's snapshot counts them."""
    async with asyncio.timeout(120), client.stream("GET", "/api/events") as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return int(json.loads(line.removeprefix("data: "))["total"])
    raise RuntimeError("the stream ended before its snapshot")


async def _until_total(client: httpx.AsyncClient, count: int, within: float) -> None:
    async with asyncio.timeout(within):
        while True:
            if await _total(client) >= count:
                return
            await asyncio.sleep(0.5)


async def _snapshot_bytes(client: httpx.AsyncClient) -> int:
    """The size of the first event's data on a page's stream: the snapshot it starts from."""
    async with asyncio.timeout(120), client.stream("GET", "/api/events") as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return len(line.removeprefix("data: ").encode())
    raise RuntimeError("the stream ended before its snapshot")


_FIRST_PAINT = """
const look = () => {
  if (document.querySelector("article.card")) window.qbFirstCardMs = performance.now();
  else requestAnimationFrame(look);
};
requestAnimationFrame(look);
"""
"""the page's own clock at the first frame that paints a card, from the navigation's start"""


async def _first_card_ms(url: str, repeats: int) -> tuple[float, float, str]:
    """From opening the signed-in page to its first card painted, by the page's clock and as Playwright sees it
    (its navigation and polling included), medians; and what the page says is waiting."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(url)
        await sign_in(page)
        await page.locator("article.card").first.wait_for(timeout=120_000)
        await page.add_init_script(_FIRST_PAINT)
        painted, times = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            await page.goto(url)
            await page.locator("article.card").first.wait_for(timeout=120_000)
            times.append((time.perf_counter() - started) * 1000)
            painted.append(float(await page.evaluate("window.qbFirstCardMs")))
        await page.locator("#more").wait_for(timeout=120_000)
        waiting = await page.locator("#more-count").text_content() or ""
        cards = await page.locator("article.card").count()
        await browser.close()
    return statistics.median(painted), statistics.median(times), f"{cards} cards on the page, {waiting}"


async def measure(
    questions: int, repeats: int, page_repeats: int = 5, agents: int = 1000, runs: int = 1
) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="qb-api-page-bench-"))
    redis = RedisServer(tmp / "redis").start()
    web, url = _start_web(redis.url, "bench", tmp)
    try:
        async with (
            Broker(redis.url, "bench", client_ttl=3600.0, **KEYS) as broker,
            httpx.AsyncClient(base_url=url, headers=_HEADERS, timeout=120) as client,
            contextlib.AsyncExitStack() as registered,
        ):
            for number in range(min(agents, questions)):  # an ask names a live agent of its broker
                await registered.enter_async_context(broker.agent(f"agent-{number}"))
            return await _measure(client, url, broker, questions, repeats, page_repeats, agents, runs)
    finally:
        stop_web(web)
        redis.kill()


async def _measure(
    client: httpx.AsyncClient,
    url: str,
    broker: Broker,
    questions: int,
    repeats: int,
    page_repeats: int,
    agents: int,
    runs: int,
) -> dict[str, Any]:
    # A chunk at a time, each shown before the next is asked: 100 000 asks at once time out
    # against a Redis shared with other work on a 2-core machine.
    asks: list[asyncio.Task[Any]] = []
    started = time.perf_counter()
    for chunk in range(0, questions, _CHUNK):
        asks += [
            asyncio.create_task(broker.ask(_request(n, agents), abort=None))
            for n in range(chunk, min(questions, chunk + _CHUNK))
        ]
        await _until_total(client, len(asks), within=600)
    middle = await _shown(client, questions, within=600)
    shown_s = time.perf_counter() - started
    figures: dict[str, Any] = {"shown_s": shown_s, "rounds": []}
    agent = f"agent-{min(agents, questions) // 2}"
    for _ in range(runs):
        round_: dict[str, Any] = {"load": _load()}
        round_["first_ms"], figures["first_b"] = await _median_ms(client, {"limit": "100"}, repeats)
        round_["urgent_ms"], _ = await _median_ms(client, {"limit": "100", "priority": "urgent"}, repeats)
        round_["agent_ms"], _ = await _median_ms(client, {"limit": "100", "agent": agent}, repeats)
        round_["middle_ms"], _ = await _median_ms(client, {"limit": "100", "after": middle}, repeats)
        painted = await _first_card_ms(url, page_repeats)
        round_["painted_ms"], round_["first_card_ms"], figures["page_says"] = painted
        figures["rounds"].append(round_)
    figures["all_ms"], figures["all_b"] = await _median_ms(client, {}, 3)
    figures["snapshot_b"] = await _snapshot_bytes(client)
    for task in asks:
        task.cancel()
    await asyncio.gather(*asks, return_exceptions=True)
    return figures


def _load() -> float:
    """The machine's load average over the last minute: its cores are shared, and the figures follow it."""
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_page", description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--page-repeats", type=int, default=5)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3, help="rounds of every figure but the unpaged list")
    options = parser.parse_args(argv)
    f = asyncio.run(
        measure(options.questions, options.repeats, options.page_repeats, max(1, options.agents), max(1, options.runs))
    )
    print(
        f"{options.questions} pending questions from {options.agents} agents"
        f" (shown by the web server after {f['shown_s']:.1f} s); any API page's target: under 50 ms"
    )
    for number, r in enumerate(f["rounds"], 1):
        print(f" run {number} (load average {r['load']:.1f}):")
        print(f"  GET /api/requests?limit=100 (first page): {r['first_ms']:.1f} ms, {f['first_b'] / 1024:.0f} KiB")
        print(f"  ... &priority=urgent: {r['urgent_ms']:.1f} ms; &agent= one agent: {r['agent_ms']:.1f} ms")
        print(f"  a page from the middle (after=): {r['middle_ms']:.1f} ms")
        print(
            f"  the page, opened to its first card painted: {r['painted_ms']:.0f} ms by its clock,"
            f" {r['first_card_ms']:.0f} ms as Playwright sees it ({f['page_says']})"
        )
    print(f" GET /api/requests (everything, unpaged): {f['all_ms']:.0f} ms, {f['all_b'] / 1024 / 1024:.1f} MiB")
    print(f" the page's first stream event (snapshot): {f['snapshot_b'] / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
