"""How the answer page copes with many pending questions, in headless Chromium.

python -m benchmarks.page [--questions 200] [--repeats 5]

A private redis-server, a ``qbroker web`` process and one asking broker that leaves
``--questions`` questions pending (five agents, a mix of priorities, one in ten a plan review).
It prints, in milliseconds (medians of ``--repeats``):

- load: from a reload of the signed-in page to every card it holds shown (at most the first 100:
  ``qbroker web --page-window``; ``benchmarks.api_page`` opens it with 100 000 pending);
- filter: from choosing an agent in the filter to the next painted frame;
- key: from pressing ``1`` (pick the first option of the first card) to the next painted frame;

and the page's height. Figures only: the tests assert behaviour, never times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.async_api import Page, async_playwright

from benchmarks.keys import KEYS
from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest, Broker, PlanReviewIntent
from workers.answering.web.config import hash_password
from workers.redis_server import RedisServer, free_port

CHROMIUM = os.environ.get("QBROKER_CHROMIUM", "/usr/bin/chromium")
_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
_USER, _PASSWORD, _TOKEN = "bench", "bench-password", "bench-token-0123456789abcdef"
_AGENTS = [f"agent-{n}" for n in range(5)]
_WINDOW = 100
_PLAN = "# Plan\n\n" + "\n".join(f"{n}. step {n}: change part {n} and check it" for n in range(1, 26))

# Time from a change to the next painted frame (a rAF, then a task after it).
_NEXT_FRAME = "new Promise((done) => requestAnimationFrame(() => setTimeout(done)))"


async def sign_in(page: Page) -> None:
    """Sign in on the page's form as the benchmarks' user (the cards follow: wait for what is measured)."""
    await page.fill("#user", _USER)
    await page.fill("#password", _PASSWORD)
    await page.click("#sign-in-button")


def _item(n: int) -> AskUserQuestionItem:
    options = (AskUserQuestionOption(label="Approve"), AskUserQuestionOption(label="Request changes"))
    if n % 10 == 0:
        return AskUserQuestionItem(
            id="plan", question=f"Plan {n}?", detail=_PLAN, options=options, intent=PlanReviewIntent(approve="Approve")
        )
    labels = ("yes", "no", "later")
    return AskUserQuestionItem(
        id="q", question=f"Question {n}?", options=tuple(AskUserQuestionOption(label=x) for x in labels)
    )


def stop_web(web: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if it has not ended 10 s later."""
    web.send_signal(signal.SIGTERM)
    try:
        web.wait(10)
    except subprocess.TimeoutExpired:
        web.kill()


def _start_web(redis_url: str, namespace: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    users = tmp / "users.toml"
    users.write_text(f'[users]\n{_USER} = "{hash_password(_PASSWORD)}"\n[tokens]\nbench = "{_TOKEN}"\n')
    port = free_port()
    args = [
        sys.executable, "-m", "workers.answering.web", "--port", str(port), "--redis-url", redis_url,
        "--namespace", namespace, "--users-file", str(users),
    ]  # fmt: skip
    with (tmp / "web.log").open("ab") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/healthz", timeout=0.5).json().get("status") == "active":
                return process, url
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the web server did not start: {(tmp / 'web.log').read_text()[-2000:]}")


async def _all_pending(url: str, count: int) -> None:
    """Wait until the web provider shows ``count`` requests (over HTTP: there is no event to wait on)."""
    headers = {"Authorization": f"Bearer {_TOKEN}"}
    async with httpx.AsyncClient(timeout=5) as client, asyncio.timeout(60):
        shown = 0
        while shown < count:
            await asyncio.sleep(0.2)
            shown = len((await client.get(url + "/api/requests", headers=headers)).json()["requests"])


async def _timed(page: Page, action: str) -> float:
    took = await page.evaluate(f"async () => {{ const t0 = performance.now(); {action}; await {_NEXT_FRAME};"
                               " return performance.now() - t0; }")  # fmt: skip
    return float(took)


async def measure(questions: int, repeats: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="qb-page-bench-"))
    redis = RedisServer(tmp / "redis").start()
    web, url = _start_web(redis.url, "bench", tmp)
    try:
        async with contextlib.AsyncExitStack() as stack:
            broker = await stack.enter_async_context(Broker(redis.url, "bench", **KEYS))
            for agent in _AGENTS:
                await stack.enter_async_context(broker.agent(agent))
            priorities = ("normal", "normal", "low", "urgent")
            asks = [
                asyncio.create_task(
                    broker.ask(
                        AskUserQuestionRequest(
                            questions=(_item(n),), agent=_AGENTS[n % len(_AGENTS)], priority=priorities[n % 4]
                        ),
                        abort=None,
                    )
                )
                for n in range(questions)
            ]
            await _all_pending(url, questions)
            playwright = await stack.enter_async_context(async_playwright())
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=_ARGS)
            # Playwright's wait_for_function evaluates a string, which the page's CSP forbids.
            page = await browser.new_page(viewport={"width": 1280, "height": 800}, bypass_csp=True)
            await page.goto(url)
            await sign_in(page)
            # A page holds the first --page-window cards (100) and counts the rest.
            all_shown = f"document.querySelectorAll('article.card').length >= {min(questions, _WINDOW)}"
            await page.wait_for_function(all_shown, timeout=60_000)
            loads, filters, keys = [], [], []
            for _ in range(repeats):
                started = time.perf_counter()
                await page.reload()
                await page.wait_for_function(all_shown, timeout=60_000)
                loads.append((time.perf_counter() - started) * 1000)
                select = "const s = document.getElementById('filter-agent')"
                filters.append(
                    await _timed(page, f"{select}; s.value = 'agent-3'; s.dispatchEvent(new Event('change'))")
                )
                await _timed(page, f"{select}; s.value = ''; s.dispatchEvent(new Event('change'))")
                keys.append(
                    await _timed(
                        page, "document.body.dispatchEvent(new KeyboardEvent('keydown', {key: '1', bubbles: true}))"
                    )
                )
            height = float(await page.evaluate("document.documentElement.scrollHeight"))
            await browser.close()
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)
        return {
            "load_ms": statistics.median(loads),
            "filter_ms": statistics.median(filters),
            "key_ms": statistics.median(keys),
            "height_px": height,
        }
    finally:
        stop_web(web)
        redis.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.page", description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args(argv)
    figures = asyncio.run(measure(options.questions, options.repeats))
    print(f"{options.questions} pending questions, medians of {options.repeats}:")
    print(f"  load (reload to every card shown): {figures['load_ms']:8.1f} ms")
    print(f"  filter by agent (to the next frame): {figures['filter_ms']:6.1f} ms")
    print(f"  key 1 on the first card (to the next frame): {figures['key_ms']:.1f} ms")
    print(f"  page height: {figures['height_px']:.0f} px")
    return 0


if __name__ == "__main__":
    sys.exit(main())
