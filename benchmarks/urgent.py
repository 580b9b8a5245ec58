"""How long an urgent question takes to reach an open page behind a backlog of normal ones.

python -m benchmarks.urgent [--pending 10000,100000] [--repeats 5] [--no-browser]

For each backlog size: a private redis-server, a ``qbroker web`` process (the default window of
100 cards) and one asking broker that leaves that many distinct normal questions pending. Once
the web server shows them all, a page is open (its change stream, ``GET /api/events``, read over
HTTP; and, unless ``--no-browser``, the signed-in page in headless Chromium). Then, ``--repeats``
times, one urgent question is asked and it prints the seconds from the ask to:

- the page's stream carrying the card in full (an ``added`` event; a ``waiting`` one only counts it);
- the API's first page (``GET /api/requests?limit=100``, polled) listing it;
- the card shown in Chromium (the open page; polled by playwright).

The median and the slowest of the repeats; "-" when it did not arrive within ``--within`` seconds
(a page that only counts it as "N more waiting" never shows it). Figures only: the tests assert
behaviour, never times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import Page, async_playwright

from benchmarks.api_page import _CHUNK, _HEADERS, _until_total
from benchmarks.keys import KEYS
from benchmarks.page import _ARGS, CHROMIUM, _start_web, sign_in, stop_web
from benchmarks.questions import OPTIONS
from broker import AskUserQuestionItem, AskUserQuestionRequest, Broker
from workers.redis_server import RedisServer

PENDING = (10_000, 100_000)
WITHIN = 15.0
"""seconds an urgent card is waited for on each face before it counts as not arrived"""
_FACES = ("stream", "api", "browser")


def _request(text: str, priority: str) -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id="q", question=text, options=OPTIONS)
    return AskUserQuestionRequest(questions=(item,), priority=priority)


def _texts(event: dict[str, Any]) -> list[str]:
    views = [event["request"]] if event.get("type") == "added" else event.get("requests", [])
    if event.get("type") not in ("added", "addedMany"):
        return []
    return [view["questions"][0]["question"] for view in views]


class _Stream:
    """An open page's change stream: when each question first arrived in full (perf_counter)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self._new = asyncio.Event()

    async def read(self, client: httpx.AsyncClient, opened: asyncio.Event) -> None:
        async with client.stream("GET", "/api/events", timeout=None) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line.removeprefix("data: "))
                opened.set()
                now = time.perf_counter()
                for text in _texts(event):
                    self.arrived.setdefault(text, now)
                self._new.set()

    async def wait(self, text: str) -> float:
        while text not in self.arrived:
            self._new.clear()
            await self._new.wait()
        return self.arrived[text]


async def _on_api(client: httpx.AsyncClient, text: str) -> float:
    while True:
        page = (await client.get("/api/requests", params={"limit": "100"})).json()
        if any(view["questions"][0]["question"] == text for view in page["requests"]):
            return time.perf_counter()
        await asyncio.sleep(0.005)


async def _on_page(page: Page, text: str) -> float:
    await page.locator("article.card", has_text=text).first.wait_for(timeout=0)
    return time.perf_counter()


@contextlib.asynccontextmanager
async def _browser_page(url: str) -> AsyncIterator[Page]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(url)
            await sign_in(page)
            await page.locator("article.card").first.wait_for(timeout=120_000)
            yield page
        finally:
            await browser.close()


async def _timed(started: float, waiting: Any, within: float) -> float | None:
    try:
        return float(await asyncio.wait_for(waiting, within)) - started
    except TimeoutError:
        return None


async def measure(pending: int, repeats: int, *, browser: bool, within: float) -> dict[str, list[float | None]]:
    tmp = Path(tempfile.mkdtemp(prefix="qb-urgent-bench-"))
    redis = RedisServer(tmp / "redis").start()
    web, url = _start_web(redis.url, "bench", tmp)
    stream = _Stream()
    times: dict[str, list[float | None]] = {face: [] for face in _FACES}
    try:
        async with (
            Broker(redis.url, "bench", client_ttl=3600.0, **KEYS) as broker,
            httpx.AsyncClient(base_url=url, headers=_HEADERS, timeout=120) as client,
            contextlib.AsyncExitStack() as stack,
        ):
            asks: list[asyncio.Task[Any]] = []
            started = time.perf_counter()
            for chunk in range(0, pending, _CHUNK):  # a chunk at a time, as benchmarks.api_page asks
                asks += [
                    asyncio.create_task(broker.ask(_request(f"Normal question {n}?", "normal"), abort=None))
                    for n in range(chunk, min(pending, chunk + _CHUNK))
                ]
                await _until_total(client, len(asks), within=600)
            print(
                f"[urgent] {pending} normal questions shown after {time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
            opened = asyncio.Event()
            reading = asyncio.create_task(stream.read(client, opened))
            await asyncio.wait_for(opened.wait(), 120)
            page = await stack.enter_async_context(_browser_page(url)) if browser else None
            for n in range(repeats):
                text = f"Urgent question {n}?"
                await asyncio.sleep(1.0)  # the page at rest, the previous card's events sent
                started = time.perf_counter()
                asks.append(asyncio.create_task(broker.ask(_request(text, "urgent"), abort=None)))
                waits = {"stream": stream.wait(text), "api": _on_api(client, text)}
                if page is not None:
                    waits["browser"] = _on_page(page, text)
                got = await asyncio.gather(*(_timed(started, wait, within) for wait in waits.values()))
                for face, took in zip(waits, got, strict=True):
                    times[face].append(took)
                print(f"[urgent] {pending} pending, ask {n}: {dict(zip(waits, got, strict=True))}", file=sys.stderr)
            reading.cancel()
            for task in asks:
                task.cancel()
            await asyncio.gather(reading, *asks, return_exceptions=True)
        return times
    finally:
        stop_web(web)
        redis.kill()


def _cell(values: list[float | None]) -> str:
    if not values:
        return "not measured"
    arrived = [value for value in values if value is not None]
    if len(arrived) < len(values):
        return f"{len(values) - len(arrived)} of {len(values)} not within the wait" + (
            f"; the others median {statistics.median(arrived):.3f} s" if arrived else ""
        )
    return f"median {statistics.median(arrived):.3f} s, slowest {max(arrived):.3f} s"


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.urgent", description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=_ints, default=PENDING, help="comma-separated backlog sizes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--within", type=float, default=WITHIN, help=f"seconds to wait for each ({WITHIN:g})")
    parser.add_argument("--no-browser", action="store_true", help="the stream and the API only, no Chromium")
    options = parser.parse_args(argv)
    results = {
        n: asyncio.run(measure(n, options.repeats, browser=not options.no_browser, within=options.within))
        for n in options.pending
    }
    print("An urgent question asked behind N pending normal ones: seconds from the ask to (target 1 s)")
    for n, times in results.items():
        print(f"{n} pending:")
        print(f"  the open page's stream, the card in full: {_cell(times['stream'])}")
        print(f"  the API's first page (limit=100): {_cell(times['api'])}")
        print(f"  the card shown in Chromium: {_cell(times['browser'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
