"""Screenshots of the answer page for a human to look at (not a test).

``.venv/bin/python -m tests.web.screenshots [OUT_DIR]`` (default ``/tmp/web-shots``): a private
redis-server, an active and a standby web server, four waiting requests; desktop 1280x800
and mobile 390x844 shots of the list, a plan review with a comment, the history, the standby
page and the disconnected page. It prints the pages' scroll widths (they must equal the
viewport's).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page, async_playwright, expect

from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest, Broker, PlanReviewIntent
from tests.helpers import KEYS, SIGNING_KEY
from tests.redis_server import RedisServer
from tests.web.conftest import WebProcess, write_users_file
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS, LONG_DETAIL, STEPS, VIEWPORTS, sign_in, write_other

# The web servers it starts sign with the tests' key, as under pytest (tests/conftest.py sets the same two).
os.environ["QBROKER_SIGNING_KEY"] = SIGNING_KEY.to_text()
os.environ["QBROKER_TRUSTED_KEYS"] = SIGNING_KEY.public_text


def options(*labels: str) -> tuple[AskUserQuestionOption, ...]:
    return tuple(AskUserQuestionOption(label=label, description=f"about {label}") for label in labels)


async def signed_in(browser: Browser, url: str, user: str, label: str) -> Page:
    mobile = label == "mobile"
    context = await browser.new_context(viewport=VIEWPORTS[label], is_mobile=mobile, has_touch=mobile)
    page = await context.new_page()
    await page.goto(url)
    await sign_in(page, user)
    return page


async def take(out: Path) -> None:
    tmp = Path(tempfile.mkdtemp())
    redis = RedisServer(tmp / "redis").start()
    users = write_users_file(tmp / "users.toml")
    active = WebProcess(redis.url, "shots", users, tmp / "a.log", name="web-a")
    active.extra = ["--public-url", f"http://127.0.0.1:{active.port}/"]
    active.start()
    standby = WebProcess(redis.url, "shots", users, tmp / "b.log", name="web-b").start()
    asks: list[asyncio.Task[Any]] = []
    try:
        async with (
            Broker(redis.url, "shots", **KEYS) as asker,
            async_playwright() as playwright,
            asker.agent("builder-7"),
        ):
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

            def ask(*questions: AskUserQuestionItem, timeout: float | None = None, agent: str | None = None) -> None:
                request = AskUserQuestionRequest(questions=questions, agent=agent)
                asks.append(asyncio.create_task(asker.ask(request, abort=None, timeout=timeout)))

            ask(
                AskUserQuestionItem(
                    id="db",
                    question="Which database for the cache?",
                    header="Storage",
                    detail="We need **fast** reads; see [the notes](https://example.org/notes).",
                    options=options("Redis (Recommended)", "Postgres"),
                ),
                agent="builder-7",
            )

            def ask_plan(id: str, question: str, plan: str, timeout: float) -> None:
                intent = PlanReviewIntent(approve="Approve")
                choices = options("Approve", "Request changes")
                ask(
                    AskUserQuestionItem(id=id, question=question, detail=plan, options=choices, intent=intent),
                    timeout=timeout,
                )

            ask_plan("plan", "Prune old releases?", LONG_DETAIL, timeout=600)
            ask_plan("migrate", "Run the 25-step migration?", STEPS, timeout=900)
            ask(
                AskUserQuestionItem(
                    id="l", question="Which languages?", options=options("Python", "Go"), multi_select=True
                ),
                AskUserQuestionItem(id="n", question="Project name?", options=options("qb", "broker")),
                AskUserQuestionItem(id="x", question="Anything else?"),
                timeout=3600,
            )
            for label in VIEWPORTS:
                page = await signed_in(browser, active.url, "alice", label)
                await expect(page.locator("article.card")).to_have_count(4)
                await page.screenshot(path=out / f"{label}-list.png", full_page=True)
                print(label, "scroll width", await page.evaluate("document.documentElement.scrollWidth"))
                card = page.locator("article.card", has_text="Prune old releases?")
                await card.get_by_role("button", name="Request changes").click()
                await card.locator("textarea.decline-note").fill(
                    "Keep ten releases, not five; and log what is deleted."
                )
                await card.screenshot(path=out / f"{label}-plan-comment.png")
                await card.get_by_role("button", name="Back").click()
                other = await signed_in(browser, standby.url, "alice", label)
                await expect(other.locator("#holder-link")).to_be_visible()
                await other.screenshot(path=out / f"{label}-standby.png")

            bob = await signed_in(browser, active.url, "bob", "desktop")
            card = bob.locator("article.card", has_text="Which database")
            await card.locator("input.option").first.focus()
            await bob.keyboard.press("1")
            await card.get_by_role("button", name="Send answer").click()
            await expect(card).to_have_count(0)
            pages = {label: await signed_in(browser, active.url, "alice", label) for label in VIEWPORTS}
            for label, page in pages.items():
                await page.get_by_role("button", name="History").click()
                await expect(page.locator("li.history-item")).to_have_count(1)
                await page.screenshot(path=out / f"{label}-history.png", full_page=True)
                await page.get_by_role("button", name="Pending").click()
                await write_other(page.locator("fieldset.question", has_text="Project name?"), "typed before the crash")
            assert active.process is not None
            active.process.kill()
            active.process.wait()
            for label, page in pages.items():
                await expect(page.locator("#banner")).to_contain_text("Disconnected")
                await page.screenshot(path=out / f"{label}-disconnected.png", full_page=True)
            await browser.close()
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)  # withdrawn while the broker is open
    finally:
        standby.stop()
        active.stop()
        redis.kill()


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/web-shots")
    target.mkdir(parents=True, exist_ok=True)
    asyncio.run(take(target))
