"""The answer page end to end in Debian's headless Chromium (Playwright drives it; no download).

One browser, one web process and one asking broker for the whole module; each test opens
its own browser contexts (separate cookie jars = separate people).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Locator, Page, async_playwright, expect

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PlanReviewIntent,
    UserQuestionError,
)
from tests.redis_server import RedisServer
from tests.web.conftest import PASSWORDS, WebProcess, write_users_file

CHROMIUM = os.environ.get("QBROKER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} missing: apt-get install chromium"),
]

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>"\'><svg onload="window.__xss=3">'


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("QBROKER_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def web(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebProcess]:
    tmp = tmp_path_factory.mktemp("web")
    process = WebProcess(
        redis_server.url, f"browser{os.getpid()}", write_users_file(tmp / "users.toml"), tmp / "web.log"
    )
    yield process.start()
    process.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def asker(web: WebProcess) -> AsyncIterator[Broker]:
    async with Broker(web.redis_url, web.namespace) as broker:
        yield broker


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


class People:
    """Browser contexts signed in as someone; closed at teardown."""

    def __init__(self, browser: Browser, web: WebProcess) -> None:
        self.browser, self.web = browser, web
        self.contexts: list[BrowserContext] = []

    async def page(self, user: str | None = "alice") -> Page:
        context = await self.browser.new_context(viewport={"width": 1000, "height": 900})
        self.contexts.append(context)
        page = await context.new_page()
        await page.goto(self.web.url)
        if user is not None:
            await page.fill("#user", user)
            await page.fill("#password", PASSWORDS[user])
            await page.click("#sign-in-button")
            await expect(page.locator("#main")).to_be_visible()
        return page

    async def close(self) -> None:
        for context in self.contexts:
            await context.close()


@pytest_asyncio.fixture(loop_scope="module")
async def people(browser: Browser, web: WebProcess) -> AsyncIterator[People]:
    people = People(browser, web)
    yield people
    await people.close()


def ask(
    broker: Broker, *questions: AskUserQuestionItem, agent: str | None = None
) -> asyncio.Task[AskUserQuestionAnswer]:
    request = AskUserQuestionRequest(questions=questions, agent=agent)
    return asyncio.create_task(broker.ask(request, abort=None, timeout=50))


def options(*labels: str, descriptions: bool = False) -> tuple[AskUserQuestionOption, ...]:
    return tuple(AskUserQuestionOption(label=x, description=f"about {x}" if descriptions else None) for x in labels)


def card(page: Page, text: str) -> Locator:
    return page.locator("article.card", has_text=text)


def fieldset(page: Page, text: str) -> Locator:
    return page.locator("fieldset.question", has_text=text)


async def test_sign_in_and_answer_single(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page(user=None)
    await page.fill("#user", "alice")
    await page.fill("#password", "wrong")
    await page.click("#sign-in-button")
    await expect(page.locator("#sign-in-error")).to_contain_text("wrong")
    await page.screenshot(path=screenshots / "01-sign-in.png")
    await page.fill("#password", PASSWORDS["alice"])
    await page.click("#sign-in-button")
    await expect(page.locator("#who")).to_have_text("alice")

    asked = ask(
        asker,
        AskUserQuestionItem(
            id="db",
            question="Which database for the cache?",
            header="Storage",
            detail="We need **fast** reads; see [the notes](https://example.org/notes).",
            options=options("Redis (Recommended)", "Postgres", descriptions=True),
        ),
        agent=None,
    )
    request = card(page, "Which database for the cache?")
    await expect(request).to_be_visible()
    await expect(request.locator(".detail strong")).to_have_text("fast")
    await expect(request.locator(".badge.recommended")).to_have_text("Recommended")
    await expect(request.locator(".desc").first).to_have_text("about Redis (Recommended)")
    await page.screenshot(path=screenshots / "02-single.png", full_page=True)
    await request.get_by_text("Redis", exact=True).click()
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    answer = await asked
    assert answer.answers[0].selected == ("Redis (Recommended)",)  # the badge is display only


async def test_multi_with_other_and_skip(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    asked = ask(
        asker,
        AskUserQuestionItem(
            id="langs", question="Which languages?", options=options("Python", "Go", "Rust"), multi_select=True
        ),
        AskUserQuestionItem(id="name", question="Project name?", options=options("qb", "broker")),
        AskUserQuestionItem(id="later", question="Anything else?"),
    )
    request = card(page, "Which languages?")
    await expect(request).to_be_visible()
    send = request.get_by_role("button", name="Send 3 answers")
    await send.click()
    await expect(request.locator(".notice")).to_contain_text("Answer or skip")  # nothing chosen yet
    langs = fieldset(page, "Which languages?")
    await langs.get_by_text("Python", exact=True).click()
    await langs.get_by_text("Rust", exact=True).click()
    await langs.locator("textarea.other").fill("Zig, later")
    name = fieldset(page, "Project name?")
    await name.get_by_text("qb", exact=True).click()
    await name.locator("textarea.other").fill("question-broker")
    await fieldset(page, "Anything else?").get_by_text("Skip this question").click()
    await page.screenshot(path=screenshots / "03-batch.png", full_page=True)
    await send.click()
    await expect(request).to_have_count(0)
    answer = await asked
    items = {item.id: (item.selected, item.custom) for item in answer.answers}
    assert items == {
        "langs": (("Python", "Rust"), "Zig, later"),
        "name": ((), "question-broker"),  # single-select: Other replaces the choice
        "later": ((), None),
    }


async def test_cancel_batch(people: People, asker: Broker) -> None:
    page = await people.page()
    asked = ask(asker, AskUserQuestionItem(id="q", question="Cancel me?", options=options("a", "b")))
    request = card(page, "Cancel me?")
    await request.get_by_role("button", name="Dismiss question").click()
    await expect(request).to_be_visible()  # destructive: it asks first
    await request.get_by_role("button", name="Yes, dismiss it").click()
    await expect(request).to_have_count(0)
    with pytest.raises(UserQuestionError) as caught:
        await asked
    assert caught.value.code == "ASK_CANCELLED"


def plan(question: str, *labels: str, approve: str) -> AskUserQuestionItem:
    return AskUserQuestionItem(
        id="plan",
        question=question,
        detail="# Plan\n\n1. write the tests\n2. make them pass\n\n```sh\nmake check\n```",
        options=options(*labels),
        intent=PlanReviewIntent(approve=approve),
    )


async def test_plan_review(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    asked = ask(asker, plan("Ship this plan?", "Refuse", "Go ahead", approve="Go ahead"))
    request = card(page, "Ship this plan?")
    await expect(request.locator(".detail h1")).to_have_text("Plan")
    await expect(request.get_by_role("button", name="Go ahead")).to_be_visible()
    await page.screenshot(path=screenshots / "04-plan-review.png", full_page=True)
    await request.get_by_role("button", name="Go ahead").click()  # approve is by label, not position
    await expect(request).to_have_count(0)
    assert (await asked).answers[0].selected == ("Go ahead",)

    refused = ask(asker, plan("Second plan?", "Approve", "Refuse", approve="Approve"))
    request = card(page, "Second plan?")
    await request.get_by_role("button", name="Refuse").click()
    await request.get_by_role("button", name="Back").click()  # changed my mind: back to the card
    await expect(request.locator(".decline")).to_be_hidden()
    await request.get_by_role("button", name="Refuse").click()
    await request.get_by_role("button", name="Send: Refuse").click()  # no note: the label alone
    await expect(request).to_have_count(0)
    assert (await refused).answers[0].selected == ("Refuse",)

    noted = ask(asker, plan("Plan with a note?", "Approve", "Request changes", approve="Approve"))
    request = card(page, "Plan with a note?")
    await request.get_by_role("button", name="Request changes").click()
    await request.get_by_label("Request changes, with a note").fill("add a rollback step first")
    await page.screenshot(path=screenshots / "04b-plan-decline-note.png", full_page=True)
    await request.get_by_role("button", name="Send: Request changes").click()
    await expect(request).to_have_count(0)
    item = (await noted).answers[0]
    # single-select: free text replaces the choice (the seeds' rule), and it is not the approve label
    assert (item.selected, item.custom) == ((), "add a rollback step first")

    only = ask(asker, plan("Only approve?", "Approve", approve="Approve"))
    request = card(page, "Only approve?")
    await expect(request.get_by_role("button", name="Approve")).to_be_visible()
    await expect(request.get_by_role("button", name="Refuse")).to_have_count(0)
    chat = request.get_by_role("button", name="Chat about it")
    await expect(chat).to_have_accessible_description(re.compile("reply in the agent's own chat"))
    await chat.click()
    await expect(request).to_have_count(0)
    with pytest.raises(UserQuestionError) as caught:
        await only
    assert caught.value.code == "ASK_CANCELLED"


async def test_plan_review_conditions_fall_back_to_the_form(people: People, asker: Broker) -> None:
    page = await people.page()
    asked = ask(asker, plan("Three ways?", "Approve", "Refuse", "Defer", approve="Approve"))
    request = card(page, "Three ways?")
    await expect(request.locator("form.answer-form")).to_be_visible()  # more than two options: generic form
    await expect(request.locator("input.option")).to_have_count(3)
    await request.get_by_text("Defer", exact=True).click()
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    assert (await asked).answers[0].selected == ("Defer",)

    # On the card itself, "Other answer…" opens the full form: free text stays reachable.
    feedback = ask(asker, plan("Card with feedback?", "Approve", "Refuse", approve="Approve"))
    request = card(page, "Card with feedback?")
    await request.get_by_role("button", name="Other answer…").click()
    await request.locator("textarea.other").fill("add a rollback step first")
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    item = (await feedback).answers[0]
    assert (item.selected, item.custom) == ((), "add a rollback step first")


async def test_withdrawn_request_vanishes(people: People, asker: Broker) -> None:
    page = await people.page()
    asked = ask(asker, AskUserQuestionItem(id="q", question="Withdraw me?", options=options("a")))
    request = card(page, "Withdraw me?")
    await expect(request).to_be_visible()
    asked.cancel()  # the asker gives up: withdrawal
    await expect(request).to_have_count(0)


async def test_two_people_race(people: People, asker: Broker, screenshots: Path) -> None:
    alice, bob = await people.page("alice"), await people.page("bob")
    asked = ask(asker, AskUserQuestionItem(id="q", question="Who is first?", options=options("me", "you")))
    for page, text in ((alice, "alice was here"), (bob, "bob typed this")):
        await card(page, "Who is first?").locator("textarea.other").fill(text)
    await card(alice, "Who is first?").get_by_role("button", name="Send answer").click()
    await expect(card(alice, "Who is first?")).to_have_count(0)
    losing = card(bob, "Who is first?")
    await expect(losing.locator(".notice")).to_contain_text("answered by alice")
    await expect(losing.locator("textarea.other")).to_have_value("bob typed this")  # nothing lost
    await expect(losing.get_by_role("button", name="Send answer")).to_be_disabled()
    await bob.screenshot(path=screenshots / "05-race-lost.png", full_page=True)
    assert (await asked).answers[0].custom == "alice was here"


async def test_asker_text_stays_inert(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    payload_label = "pick " + XSS
    async with asker.agent("agent " + XSS):
        asked = asyncio.create_task(
            asker.ask(
                AskUserQuestionRequest(
                    agent="agent " + XSS,
                    questions=(
                        AskUserQuestionItem(
                            id="q" + XSS,
                            question="Evil? " + XSS,
                            header="head " + XSS,
                            detail=f"plan {XSS}\n\n[link](javascript:window.__xss=4)"
                            ' <a href="javascript:alert(1)">x</a>\n\n![img](https://example.org/x.png)',
                            options=(AskUserQuestionOption(label=payload_label, description="desc " + XSS),),
                        ),
                    ),
                ),
                abort=None,
                timeout=50,
            )
        )
        request = card(page, "Evil?")
        await expect(request).to_be_visible()
        await expect(request.locator(".question-text")).to_contain_text("Evil? " + XSS)  # shown as text
        await expect(request.locator(".agent")).to_have_text("agent " + XSS)
        injected = await page.evaluate(
            "document.querySelectorAll('#requests img, #requests script, #requests svg, #requests iframe').length"
        )
        assert injected == 0
        hrefs = await request.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
        assert all(h is not None and not h.lower().startswith("javascript") for h in hrefs)
        await page.screenshot(path=screenshots / "06-xss-inert.png", full_page=True)
        await request.locator("input.option").check()
        await request.get_by_role("button", name="Send answer").click()
        await expect(request).to_have_count(0)
        answer = await asked
    assert answer.answers[0].selected == (payload_label,)
    assert await page.evaluate("window.__xss") is None
    assert dialogs == []


async def test_standby_banner(people: People, web: WebProcess, tmp_path: Path, screenshots: Path) -> None:
    second = WebProcess(web.redis_url, web.namespace, web.users_file, tmp_path / "web2.log", name="web-2").start()
    try:
        people.web = second
        page = await people.page()
        await expect(page.locator("#banner")).to_contain_text("Standing by: web-1")
        await page.screenshot(path=screenshots / "07-standby.png")
    finally:
        people.web = web
        second.stop()
