"""Urgent first on the page, whatever the backlog (issue "The page a team trusts at fleet size", row 1).

A real web process (the default window of 100 cards) with 199 normal questions pending, in headless
Chromium: an urgent question asked behind them is the first card, one asked while the page is open
appears on it, and the priority filter offers every priority pending (a low one beyond the window too).

The tests run in order on one backlog: each states what it adds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, expect

from broker import AskUserQuestionItem, AskUserQuestionRequest, Broker
from tests.helpers import KEYS
from tests.redis_server import RedisServer
from tests.web import test_browser as shared
from tests.web.conftest import TOKEN, Backlog, WebProcess, backlog_shown, module_web, write_users_file
from tests.web.test_browser import People, options

NORMAL = 199
BEARER = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = shared.BROWSER_MARKS


@pytest.fixture(scope="module")
def web(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebProcess]:
    yield from module_web(redis_server, tmp_path_factory, f"urgent{os.getpid()}")


def question(text: str, priority: str = "normal") -> AskUserQuestionRequest:
    item = AskUserQuestionItem(id="q", question=text, options=options("yes", "no"))
    return AskUserQuestionRequest(questions=(item,), priority=priority)


async def pending(web: WebProcess) -> list[dict[str, object]]:
    async with httpx.AsyncClient(base_url=web.url, headers=BEARER) as client:
        listed: list[dict[str, object]] = (await client.get("/api/requests")).json()["requests"]
        return listed


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backlog(web: WebProcess) -> AsyncIterator[Backlog]:
    """``NORMAL`` normal questions, shown by the web server (one by one, as they were asked) before the first test."""

    async def shown() -> int:
        return len(await pending(web))

    async with backlog_shown(web, [question(f"Normal question {n}?") for n in range(NORMAL)], shown, 40) as asked:
        yield asked


browser, people = shared.browser, shared.people  # test_browser's fixtures, each module its own


@pytest.mark.timeout(90)
async def test_an_urgent_ask_behind_the_backlog_is_the_first_card_and_the_filter_offers_it(
    people: People, web: WebProcess, backlog: Backlog
) -> None:
    asker, asks = backlog
    for text, priority in (("A low question?", "low"), ("First urgent question?", "urgent")):
        asks.append(asyncio.create_task(asker.ask(question(text, priority), abort=None, timeout=300)))
    async with asyncio.timeout(20):
        while len(await pending(web)) < NORMAL + 2:
            await asyncio.sleep(0.1)
    page = await people.page()
    cards = page.locator("#requests article.card")
    await expect(cards.first).to_contain_text("First urgent question?")
    await expect(cards).to_have_count(100)
    await expect(page.locator("#more-count")).to_have_text(f"{NORMAL + 2 - 100} more waiting")
    # Every priority pending is offered, the low one too, though its card is beyond the window.
    offered = await page.locator("#filter-priority option").evaluate_all("options => options.map((o) => o.value)")
    assert {"urgent", "normal", "low"} <= set(offered), offered
    await page.get_by_label("Filter by priority").select_option("urgent")
    await expect(page.locator("#requests article.card:visible")).to_have_count(1)
    await expect(page.locator("#requests article.card:visible")).to_contain_text("First urgent question?")


@pytest.mark.timeout(90)
async def test_an_urgent_ask_while_the_page_is_open_appears_on_it(
    people: People, web: WebProcess, backlog: Backlog
) -> None:
    """The window is full of older cards; an urgent one asked now is sent to the open page, ahead of them all."""
    asker, asks = backlog
    page = await people.page()
    cards = page.locator("#requests article.card")
    await expect(cards).to_have_count(100)
    waiting = await page.locator("#more-count").text_content()
    priorities = "cards => cards.map((c) => c.querySelector('.priority').textContent)"
    urgent_before = (await cards.evaluate_all(priorities)).count("urgent")  # an earlier test of the module may add one
    asks.append(asyncio.create_task(asker.ask(question("Urgent while open?", "urgent"), abort=None, timeout=300)))
    arrived = page.locator("article.card", has_text="Urgent while open?")
    await expect(arrived).to_be_visible(timeout=30_000)  # a generous wait, not a measurement
    shown = await cards.evaluate_all(priorities)
    leading = urgent_before + 1
    assert shown[:leading] == ["urgent"] * leading, shown[: leading + 1]  # every urgent card leads the list
    await expect(page.locator("#more-count")).to_have_text(waiting or "")  # the normal ones still counted, not sent


@pytest.mark.timeout(90)
async def test_a_normal_ask_placed_before_a_page_that_fetched_on_into_the_low_ones_still_reaches_it(
    people: People, web: WebProcess, backlog: Backlog
) -> None:
    """The page fetched every card (its cursor among the low ones, past the normal ones its stream sent): a normal
    question asked now is placed before that cursor, so "show more" would never bring it; the page fetches it."""
    asker, asks = backlog
    # Its own low question, the last in the page's order whatever the module's earlier tests added (run alone,
    # the test once found no low card and no third window to show)
    asks.append(asyncio.create_task(asker.ask(question("Its own low question?", "low"), abort=None, timeout=300)))
    async with asyncio.timeout(20):
        while not any("Its own low question?" in str(view) for view in await pending(web)):
            await asyncio.sleep(0.1)
    page = await people.page()
    cards = page.locator("#requests article.card")
    await expect(cards).to_have_count(100)
    while await page.locator("#more").is_visible():  # 100 more, then the rest
        before = await cards.count()
        await page.locator("#show-more").click()
        await expect(cards).not_to_have_count(before)
    await expect(cards.last).to_contain_text("Its own low question?")  # every pending card loaded, the low last
    loaded = await cards.count()
    asks.append(asyncio.create_task(asker.ask(question("A late normal question?"), abort=None, timeout=300)))
    await expect(page.locator("article.card", has_text="A late normal question?")).to_be_visible(timeout=30_000)
    await expect(cards).to_have_count(loaded + 1)
    await expect(page.locator("#more")).to_be_hidden()  # not counted as waiting: it is here


@pytest.fixture
def small_window(redis_server: RedisServer, tmp_path: Path) -> Iterator[WebProcess]:
    process = WebProcess(
        redis_server.url,
        f"flood{os.getpid()}",
        write_users_file(tmp_path / "users.toml"),
        tmp_path / "web.log",
        extra=["--page-window", "5"],
    )
    yield process.start()
    process.stop()


@pytest.mark.timeout(90)
async def test_a_flood_of_urgent_asks_brings_two_windows_worth_and_counts_the_rest_in_order(
    browser: Browser, small_window: WebProcess
) -> None:
    """A window of 5 holding normal cards; 20 urgent asks at once: 5 are sent in full, 5 more fetched from their
    place, the other 10 counted, and "Show the next 5" brings the next urgent ones (not the normal ones after)."""
    people = People(browser, small_window)
    async with Broker(small_window.redis_url, small_window.namespace, **KEYS) as asker:
        asks = [asyncio.create_task(asker.ask(question(f"Normal {n}?"), abort=None, timeout=300)) for n in range(10)]
        try:
            async with asyncio.timeout(20):
                while len(await pending(small_window)) < 10:
                    await asyncio.sleep(0.1)
            page = await people.page()
            cards = page.locator("#requests article.card")
            await expect(cards).to_have_count(5)
            asks += [
                asyncio.create_task(asker.ask(question(f"Flood {n}?", "urgent"), abort=None, timeout=300))
                for n in range(20)
            ]
            await expect(page.locator("#more-count")).to_have_text("15 more waiting", timeout=30_000)
            await expect(cards).to_have_count(15)
            await page.locator("#show-more").click()
            await expect(cards).to_have_count(20)
            urgent = page.locator("#requests article.card .priority.urgent")
            await expect(urgent).to_have_count(15)
        finally:
            await people.close()
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)


_FIRST_FRAME = """
window.qbFirstFrame = null;
const look = () => {
  const cards = [...document.querySelectorAll("#requests article.card")].map((card) => card.dataset.id);
  if (cards.length) window.qbFirstFrame = cards; else requestAnimationFrame(look);
};
requestAnimationFrame(look);
"""


@pytest.mark.timeout(90)
async def test_the_first_screenful_is_painted_before_the_rest_of_the_window_is_built(
    people: People, web: WebProcess, backlog: Backlog
) -> None:
    """The issue's "the first card with 10 000 pending takes 1.0-1.15 s to paint": the page built all 100 cards of
    its window before the first frame. It paints the first 10 (about a screenful), then adds the rest, in order."""
    page = await people.page()
    await expect(page.locator("#requests article.card")).to_have_count(100)
    await page.add_init_script(_FIRST_FRAME)
    await page.reload()
    await expect(page.locator("#requests article.card")).to_have_count(100)
    first_frame = await page.evaluate("window.qbFirstFrame")
    shown = await page.locator("#requests article.card").evaluate_all("(cards) => cards.map((c) => c.dataset.id)")
    assert len(first_frame) == 10, len(first_frame)
    assert shown[:10] == first_frame  # the same cards first, in the same order
    listed = [str(view["id"]) for view in await pending(web)]
    assert shown == listed[:100]  # and the window as before: the server's order
    assert await page.locator("#more-count").text_content() == f"{len(listed) - 100} more waiting"
