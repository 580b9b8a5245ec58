"""The answer page end to end in Debian's headless Chromium (Playwright drives it; no download).

One browser, one web process and one asking broker for the whole module; each test opens
its own browser contexts (separate cookie jars = separate people).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from msgspec.structs import replace as msgspec_replace
from playwright.async_api import (
    Browser,
    BrowserContext,
    Locator,
    Page,
    Route,
    ViewportSize,
    async_playwright,
    expect,
)
from redis.asyncio import Redis

from broker import (
    Agent,
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PlanReviewIntent,
    UserQuestionError,
)
from broker._keys import Keys
from tests.helpers import KEYS
from tests.redis_server import RedisServer
from tests.web.conftest import PASSWORDS, WebProcess, module_web, qbroker, write_users_file

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

VIEWPORTS: dict[str, ViewportSize] = {
    "desktop": {"width": 1280, "height": 800},
    "mobile": {"width": 390, "height": 844},
}
"""the two sizes the page is checked and shown at"""

BROWSER_MARKS = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} missing: apt-get install chromium"),
]
"""what every module sharing this one's browser, web process and asker marks its tests with"""
pytestmark = BROWSER_MARKS

XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>"\'><svg onload="window.__xss=3">'


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("QBROKER_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def web(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebProcess]:
    yield from module_web(redis_server, tmp_path_factory, f"browser{os.getpid()}")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def asker(web: WebProcess) -> AsyncIterator[Broker]:
    async with Broker(web.redis_url, web.namespace, **KEYS) as broker:
        yield broker


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


async def fill_sign_in(page: Page, user: str, password: str | None = None) -> None:
    """Fill the sign-in form as ``user`` (with their password unless told another) and press Sign in."""
    await page.fill("#user", user)
    await page.fill("#password", PASSWORDS[user] if password is None else password)
    await page.click("#sign-in-button")


class HeldRoute:
    """A route handler that holds the first request it sees until ``released`` is set (an answer that comes
    late, as under load); ``seen`` is set once that request came."""

    def __init__(self) -> None:
        self.seen, self.released = asyncio.Event(), asyncio.Event()

    async def __call__(self, route: Route) -> None:
        if not self.seen.is_set():
            self.seen.set()
            await self.released.wait()
        await route.continue_()


async def sign_in(page: Page, user: str) -> None:
    """Sign in as ``user`` on the page's form; returns once the cards' pane shows."""
    await fill_sign_in(page, user)
    await expect(page.locator("#main")).to_be_visible()


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
            await sign_in(page, user)
        return page

    async def close(self) -> None:
        for context in self.contexts:
            await context.close()


@contextlib.asynccontextmanager
async def own_web(
    browser: Browser, redis_url: str, namespace: str, tmp_path: Path, *, release: asyncio.Event | None = None
) -> AsyncIterator[tuple[WebProcess, People]]:
    """A web server of the test's own (one it kills, restarts or cuts off), and people's pages on it; at the end
    ``release`` is set (a route held on it lets go), the pages close and the server stops."""
    web = WebProcess(redis_url, namespace, write_users_file(tmp_path / "u.toml"), tmp_path / "w.log").start()
    people = People(browser, web)
    try:
        yield web, people
    finally:
        if release is not None:
            release.set()
        await people.close()
        web.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def people(browser: Browser, web: WebProcess) -> AsyncIterator[People]:
    people = People(browser, web)
    yield people
    await people.close()


def ask(
    broker: Broker | Agent,
    *questions: AskUserQuestionItem,
    agent: str | None = None,
    timeout: float | None = 50,
    priority: str = "normal",
) -> asyncio.Task[AskUserQuestionAnswer]:
    request = AskUserQuestionRequest(questions=questions, agent=agent, priority=priority)
    return asyncio.create_task(broker.ask(request, abort=None, timeout=timeout))


def options(*labels: str, descriptions: bool = False) -> tuple[AskUserQuestionOption, ...]:
    return tuple(AskUserQuestionOption(label=x, description=f"about {x}" if descriptions else None) for x in labels)


def card(page: Page, text: str) -> Locator:
    return page.locator("article.card", has_text=text)


def fieldset(page: Page, text: str) -> Locator:
    return page.locator("fieldset.question", has_text=text)


async def write_other(scope: Locator, text: str) -> None:
    """Pick "Other…" (which opens the text box) and type ``text``."""
    await scope.get_by_text("Other…", exact=True).click()
    await scope.locator("textarea.other").fill(text)


async def test_sign_in_and_answer_single(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page(user=None)
    await fill_sign_in(page, "alice", "wrong")
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
    await write_other(langs, "Zig, later")
    name = fieldset(page, "Project name?")
    await name.get_by_text("qb", exact=True).click()
    await write_other(name, "question-broker")
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
    await write_other(request, "add a rollback step first")
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


async def test_a_keyed_question_stays_with_asker_away_and_its_answer_reaches_the_restarted_asker(
    people: People, web: WebProcess, screenshots: Path
) -> None:
    page = await people.page()
    question = AskUserQuestionItem(id="ship", question="Ship release 2.4.0?", options=options("ship", "hold"))
    request = AskUserQuestionRequest(questions=(question,))
    first = Broker(web.redis_url, web.namespace, **KEYS)
    await first.__aenter__()
    asking = asyncio.create_task(first.ask(request, key="release-2.4.0"))
    shown = card(page, "Ship release 2.4.0?")
    await expect(shown).to_be_visible()
    await expect(shown.locator(".away")).to_be_hidden()
    await first.aclose()  # the asking process stops: the question is detached, not withdrawn
    with pytest.raises(UserQuestionError):
        await asking
    await expect(shown.locator(".away")).to_be_visible()
    # The grace counts down on the card (300 s by default): answer before it ends, or the question ends.
    await expect(shown.locator(".away")).to_have_text(re.compile(r"^asker away · ends in [45] min$"))
    assert "Answer before" in (await shown.locator(".away").get_attribute("title") or "")
    await page.screenshot(path=screenshots / "14-asker-away.png", full_page=True)
    await write_other(shown, "after the freeze")  # the human is halfway through
    async with Broker(web.redis_url, web.namespace, **KEYS) as restarted:
        again = asyncio.create_task(restarted.ask(request, key="release-2.4.0"))
        await expect(shown.locator(".away")).to_be_hidden()  # re-attached: the same card, back
        await expect(card(page, "Ship release 2.4.0?")).to_have_count(1)
        await expect(shown.locator("textarea.other")).to_have_value("after the freeze")
        await shown.get_by_role("button", name="Send answer").click()
        await expect(shown).to_have_count(0)
        answer = await asyncio.wait_for(again, 10)
    assert answer.answers[0].custom == "after the freeze"


async def test_identical_questions_of_several_agents_are_one_card_and_one_answer_reaches_each(
    people: People, web: WebProcess, screenshots: Path
) -> None:
    page = await people.page()
    question = "Run the database migration 0042?"
    async with contextlib.AsyncExitStack() as stack:
        asks = []
        for n in (1, 2, 3):
            broker = await stack.enter_async_context(Broker(web.redis_url, web.namespace, **KEYS))
            agent = await stack.enter_async_context(broker.agent(f"builder-{n}"))
            item = AskUserQuestionItem(id=f"migrate-{n}", question=question, options=options("run", "wait"))
            asks.append(asyncio.create_task(agent.ask(AskUserQuestionRequest(questions=(item,)), timeout=50)))
            if n == 2:
                shown = card(page, question)
                await expect(shown.locator(".askers")).to_have_text("asked by 2 agents")
        await expect(shown.locator(".askers")).to_have_text("asked by 3 agents")  # the third joined, live
        await expect(card(page, question)).to_have_count(1)
        await shown.locator(".askers").click()
        await expect(shown.locator(".askers-list li")).to_have_text(
            ["builder-1 (claimed)", "builder-2 (claimed)", "builder-3 (claimed)"]  # no gateway vouched for them
        )
        await expect(shown.locator("select.remember-scope option[value=agent]")).to_have_text(
            "Remember for each of these 3 agents"
        )
        await page.screenshot(path=screenshots / "15-asked-by-three.png", full_page=True)
        await shown.get_by_text("run", exact=True).click()
        await shown.get_by_role("button", name="Send answer").click()
        answers = await asyncio.wait_for(asyncio.gather(*asks), 10)
    assert [(a.answers[0].id, a.answers[0].selected) for a in answers] == [
        (f"migrate-{n}", ("run",)) for n in (1, 2, 3)
    ]


async def test_two_people_race(people: People, asker: Broker, screenshots: Path) -> None:
    alice, bob = await people.page("alice"), await people.page("bob")
    asked = ask(asker, AskUserQuestionItem(id="q", question="Who is first?", options=options("me", "you")))
    for page, text in ((alice, "alice was here"), (bob, "bob typed this")):
        await write_other(card(page, "Who is first?"), text)
    await card(alice, "Who is first?").get_by_role("button", name="Send answer").click()
    await expect(card(alice, "Who is first?")).to_have_count(0)
    losing = card(bob, "Who is first?")
    await expect(losing.locator(".notice")).to_contain_text("answered by alice: “alice was here”")  # what won
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


async def test_untouched_card_a_teammate_answered_says_so(people: People, asker: Broker) -> None:
    alice, bob = await people.page("alice"), await people.page("bob")
    asked = ask(asker, AskUserQuestionItem(id="q", question="Teammate answers this?", options=options("yes", "no")))
    await card(alice, "Teammate answers this?").get_by_text("no", exact=True).click()
    await card(alice, "Teammate answers this?").get_by_role("button", name="Send answer").click()
    await expect(card(bob, "Teammate answers this?")).to_have_count(0)
    await expect(bob.locator(".settled-note")).to_contain_text(
        "Teammate answers this? — Already answered by alice: no."
    )
    assert (await asked).answers[0].selected == ("no",)


async def test_title_count_order_times_and_history(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    relaxed = ask(asker, AskUserQuestionItem(id="q", question="No hurry?", options=options("a", "b")), timeout=None)
    await expect(card(page, "No hurry?")).to_be_visible()
    async with asker.agent("builder-7"):
        urgent = ask(
            asker,
            AskUserQuestionItem(id="q", question="Deploy now?", header="Release", options=options("yes", "no")),
            agent="builder-7",
            timeout=40,
            priority="urgent",
        )
        await expect(card(page, "Deploy now?")).to_be_visible()
        await expect(page).to_have_title(re.compile(r"^\(2\) Questions · browser"))
        titles = await page.locator("article.card .question-text").all_inner_texts()
        assert titles[0].endswith("Deploy now?") and titles[1].endswith("No hurry?"), titles  # urgent first
        deploy = card(page, "Deploy now?")
        await expect(deploy.locator(".priority")).to_have_text("urgent")
        await expect(card(page, "No hurry?").locator(".priority")).to_be_hidden()
        await expect(deploy.locator(".agent")).to_have_text("builder-7")
        await expect(deploy.locator(".left")).to_have_text(re.compile(r"^(39|40) s left$"))
        await expect(card(page, "No hurry?").locator(".left")).to_be_hidden()
        await expect(deploy.locator(".header-chip")).to_have_count(1)  # one header per card
        await page.screenshot(path=screenshots / "08-list-desktop.png", full_page=True)
        await deploy.get_by_text("yes", exact=True).click()
        await deploy.get_by_role("button", name="Send answer").click()
        assert (await urgent).answers[0].selected == ("yes",)
    await expect(page).to_have_title(re.compile(r"^\(1\) Questions"))
    hurry = card(page, "No hurry?")
    await write_other(hurry, "whenever you like")
    await hurry.get_by_role("button", name="Send answer").click()
    assert (await relaxed).answers[0].custom == "whenever you like"
    await expect(page).to_have_title(re.compile(r"^Questions"))

    await page.get_by_role("button", name="History").click()
    history = page.locator("#history")
    await expect(history.locator("li.history-item").first).to_contain_text("No hurry?")
    await expect(history.locator("li.history-item").first).to_contain_text("“whenever you like”")
    await expect(history.locator("li.history-item").first).to_contain_text("by alice")
    await expect(history.locator("li.history-item", has_text="Deploy now?")).to_contain_text("asked by builder-7")
    await page.screenshot(path=screenshots / "09-history.png", full_page=True)


async def test_keyboard_digits_pick_and_enter_needs_send(people: People, asker: Broker) -> None:
    page = await people.page()
    asked = ask(asker, AskUserQuestionItem(id="q", question="Pick by key?", options=options("red", "green", "blue")))
    request = card(page, "Pick by key?")
    await expect(request).to_be_visible()
    await request.locator("input.option").first.focus()
    await page.keyboard.press("3")
    await expect(request.locator("input.option").nth(2)).to_be_checked()
    await page.keyboard.press("Enter")  # on an option: nothing is sent
    await page.wait_for_timeout(300)
    assert not asked.done()
    await request.get_by_role("button", name="Send answer").focus()
    await page.keyboard.press("Enter")
    await expect(request).to_have_count(0)
    assert (await asked).answers[0].selected == ("blue",)


async def test_failed_send_keeps_the_answer(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    asked = ask(asker, AskUserQuestionItem(id="q", question="Network trouble?", options=options("a", "b")))
    request = card(page, "Network trouble?")
    await write_other(request, "my careful answer")
    await page.route("**/api/requests/*/answer", lambda route: route.abort())
    await request.get_by_role("button", name="Send answer").click()
    await expect(request.locator(".notice")).to_contain_text("Could not reach the server, so nothing was sent")
    await expect(request.locator("textarea.other")).to_have_value("my careful answer")
    assert "undefined" not in await request.locator(".notice").inner_text()
    await page.unroute("**/api/requests/*/answer")
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    assert (await asked).answers[0].custom == "my careful answer"


async def test_disconnected_page_pauses_and_resumes(
    browser: Browser, redis_server: RedisServer, tmp_path: Path, screenshots: Path
) -> None:
    namespace = f"down{os.getpid()}"
    async with own_web(browser, redis_server.url, namespace, tmp_path) as (web, people):
        page = await people.page()
        async with Broker(redis_server.url, namespace, **KEYS) as asker:
            asked = ask(asker, AskUserQuestionItem(id="q", question="Still there?", options=options("yes", "no")))
            request = card(page, "Still there?")
            await write_other(request, "typed before the crash")
            assert web.process is not None
            web.process.kill()  # the server dies
            web.process.wait()
            await expect(page.locator("#banner")).to_contain_text("Disconnected from the server")
            await expect(request.get_by_role("button", name="Send answer")).to_be_disabled()
            await expect(request.locator("textarea.other")).to_have_value("typed before the crash")
            await page.screenshot(path=screenshots / "10-disconnected.png", full_page=True)
            web.start()  # same port; sessions live in Redis, the request is redelivered after the lease TTL
            await expect(request.get_by_role("button", name="Send answer")).to_be_enabled(timeout=20_000)
            await expect(page.locator("#banner")).to_be_hidden()
            await expect(request.locator("textarea.other")).to_have_value("typed before the crash")
            await request.get_by_role("button", name="Send answer").click()
            await expect(request).to_have_count(0)
            assert (await asked).answers[0].custom == "typed before the crash"


async def test_a_card_delivered_again_while_the_page_asks_what_became_of_it_stays_answerable(
    browser: Browser, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Issue "the page a team trusts at fleet size": after a restart, a page that reconnected before the new
    server took the lease was shown no cards and asked the history what became of its card; the card was
    delivered again while that answer was on its way, and the late answer (not settled) closed it for good."""
    namespace = f"again{os.getpid()}"
    # The history read the reconnected page starts is slow, as under load: it answers after the redelivery.
    history = HeldRoute()
    async with own_web(browser, redis_server.url, namespace, tmp_path, release=history.released) as (web, people):
        page = await people.page()
        await page.route("**/api/history*", history)
        lease = Keys(namespace).provider
        async with (
            Broker(redis_server.url, namespace, **KEYS) as asker,
            Redis.from_url(redis_server.url, decode_responses=True) as redis,
        ):
            asked = ask(asker, AskUserQuestionItem(id="q", question="Still there?", options=options("yes", "no")))
            goes = ask(asker, AskUserQuestionItem(id="q", question="Withdrawn meanwhile?", options=options("yes")))
            request = card(page, "Still there?")
            await write_other(request, "typed before the crash")
            await expect(page.locator("article.card")).to_have_count(2)
            held_by_the_dead = await redis.get(lease)
            assert held_by_the_dead is not None and web.process is not None
            web.process.kill()
            web.process.wait()
            # The dead server's lease outlives the restart until the test lets it lapse: the new server stands by.
            await redis.set(lease, held_by_the_dead, px=60_000)
            goes.cancel()  # gone while no server listened: the page learns it from the history
            await asyncio.gather(goes, return_exceptions=True)
            await expect(page.locator("#banner")).to_contain_text("Disconnected from the server")
            await asyncio.to_thread(web.start)
            await expect(page.locator("#banner")).to_contain_text("Standing by")
            async with asyncio.timeout(20):
                await history.seen.wait()  # the standby showed no cards: the page asks what became of them
            await redis.delete(lease)  # the lease lapses: the new server takes it and delivers the card again
            async with asyncio.timeout(20):
                while "Still there?" not in await (await page.request.get(web.url + "/api/requests")).text():
                    await asyncio.sleep(0.1)
            later = ask(asker, AskUserQuestionItem(id="q", question="Asked after the takeover?", options=options("ok")))
            await expect(card(page, "Asked after the takeover?")).to_be_visible()  # the redelivery reached the page
            history.released.set()
            # The page has acted on the late history answer: the card it names gone left its note.
            await expect(page.locator(".settled-note")).to_contain_text("Withdrawn meanwhile? — Withdrawn")
            await expect(request.locator(".notice")).to_have_text("")
            await expect(request.get_by_role("button", name="Send answer")).to_be_enabled()
            await expect(request.locator("textarea.other")).to_have_value("typed before the crash")
            await request.get_by_role("button", name="Send answer").click()
            await expect(request).to_have_count(0)
            assert (await asyncio.wait_for(asked, 10)).answers[0].custom == "typed before the crash"
            later.cancel()
            await asyncio.gather(later, return_exceptions=True)


async def test_standby_links_the_active_server(
    browser: Browser, redis_server: RedisServer, tmp_path: Path, screenshots: Path
) -> None:
    namespace = f"pair{os.getpid()}"
    users = write_users_file(tmp_path / "u.toml")
    active = WebProcess(redis_server.url, namespace, users, tmp_path / "a.log", name="web-a")
    active.extra = ["--public-url", f"http://127.0.0.1:{active.port}/"]
    active.start()
    standby = WebProcess(redis_server.url, namespace, users, tmp_path / "b.log", name="web-b").start()
    people = People(browser, standby)
    try:
        page = await people.page()
        await expect(page.locator("#banner")).to_contain_text("Standing by: web-a is serving this namespace")
        link = page.locator("#holder-link")
        await expect(link).to_have_attribute("href", active.url + "/")
        await expect(page.locator("#empty")).to_contain_text("standing by")
        await expect(page.locator("#empty")).not_to_contain_text("No pending questions")
        await page.screenshot(path=screenshots / "11-standby.png")
        await link.click()
        await expect(page).to_have_url(active.url + "/")
    finally:
        await people.close()
        standby.stop()
        active.stop()


async def test_a_page_behind_a_terminal_lists_read_only_and_takes_over(
    browser: Browser, redis_server: RedisServer, tmp_path: Path, screenshots: Path
) -> None:
    """Issue 26, item 6: a `qbroker provide` holding the lease left the page with "Standing by" and no list."""
    namespace = f"behind{os.getpid()}"
    async with (
        Broker(redis_server.url, namespace, lease_ttl=2, **KEYS) as terminal,
        Broker(redis_server.url, namespace, **KEYS) as asking,
    ):
        holding, shown = asyncio.Event(), []

        async def hold() -> str:
            async with terminal.provider("alice@laptop") as provider:
                holding.set()
                async for pending in provider:  # shows, answers nothing; ends on the handover
                    shown.append(pending)
                assert provider.handover is not None
                return provider.handover.by

        held = asyncio.create_task(hold())
        await asyncio.wait_for(holding.wait(), 10)
        web = WebProcess(redis_server.url, namespace, write_users_file(tmp_path / "u.toml"), tmp_path / "w.log")
        await asyncio.to_thread(web.start)  # the holder renews its lease meanwhile
        people = People(browser, web)
        try:
            asked = ask(asking, AskUserQuestionItem(id="q", question="Ship the release?", options=options("Yes", "No")))
            page = await people.page("bob")
            await expect(page.locator("#banner")).to_contain_text("Standing by: alice@laptop")
            listed = page.locator("#readonly li", has_text="Ship the release?")
            await expect(listed).to_be_visible()
            await expect(page.locator("#readonly")).not_to_contain_text("Send answer")
            await page.screenshot(path=screenshots / "27-read-only-behind-a-terminal.png")
            await page.get_by_role("button", name="Take over").click()
            request = card(page, "Ship the release?")
            await expect(request).to_be_visible(timeout=15_000)
            await expect(page.locator("#readonly li")).to_have_count(0)
            assert await asyncio.wait_for(held, 10) == "bob"
            await request.get_by_text("Yes", exact=True).click()
            await request.get_by_role("button", name="Send answer").click()
            assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("Yes",)
        finally:
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
            await people.close()
            web.stop()


async def test_a_take_over_says_what_it_waits_for_and_past_its_bound_why_not_and_what_to_do(
    browser: Browser, redis_server: RedisServer, tmp_path: Path, screenshots: Path
) -> None:
    """Row 3 of "the page a team trusts at fleet size": "Take over" pressed while the holder does not let go; the
    page said nothing, still the holder's after 75 s. Now it says it waits for the holder and within what bound,
    and past it why not and what to do (stop the holder, or ask again)."""
    namespace = f"stuck{os.getpid()}"
    async with Broker(redis_server.url, namespace, lease_ttl=2, **KEYS) as terminal:
        holding = asyncio.Event()

        async def hold() -> None:
            async with terminal.provider("alice@laptop"):  # renews its lease, never looks at a handover
                holding.set()
                await asyncio.sleep(60)

        held = asyncio.create_task(hold())
        await asyncio.wait_for(holding.wait(), 10)
        web = WebProcess(redis_server.url, namespace, write_users_file(tmp_path / "u.toml"), tmp_path / "w.log")
        web.extra = ["--handover-grace", "1"]
        await asyncio.to_thread(web.start)
        people = People(browser, web)
        try:
            page = await people.page("bob")
            await expect(page.locator("#banner")).to_contain_text("Standing by: alice@laptop")
            await page.get_by_role("button", name="Take over").click()
            banner = page.locator("#banner")
            await expect(banner).to_contain_text("bob asked it to hand over: waiting for alice@laptop")
            await expect(banner).to_contain_text("within 2 s")
            late = page.locator(".takeover-late")
            await expect(late).to_contain_text("alice@laptop has not handed over", timeout=10_000)
            await expect(late).to_contain_text("Ctrl-C at its terminal (or SIGTERM) releases the lease at once")
            await expect(page.get_by_role("button", name="Ask again")).to_be_visible()
            await page.screenshot(path=screenshots / "28-take-over-not-answered.png")
        finally:
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
            await people.close()
            web.stop()


LONG_DETAIL = """Touch `/srv/deploy/releases/2026-11-30T20-22-12Z/very/deeply/nested/path/that/never/breaks/config.toml`
and hash `sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08`.

| file | before | after |
| --- | --- | --- |
| /srv/deploy/releases/current/a-really-long-file-name-with-no-spaces.yaml | 1 | 2 |

> Quote: keep the old release for a day.

```
for release in $(ls -1 /srv/deploy/releases | sort | head -n -5); do rm -rf "/srv/deploy/releases/$release"; done
```
"""


@contextlib.asynccontextmanager
async def phone(browser: Browser, web: WebProcess) -> AsyncIterator[Page]:
    """alice signed in on a 390x844 touch screen without a keyboard; the context closes after."""
    context = await browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page = await context.new_page()
        await page.goto(web.url)
        await fill_sign_in(page, "alice")
        yield page
    finally:
        await context.close()


async def test_mobile_layout_fits(browser: Browser, web: WebProcess, asker: Broker, screenshots: Path) -> None:
    async with phone(browser, web) as page:
        asked = ask(
            asker,
            AskUserQuestionItem(
                id="plan",
                question="Prune old releases?",
                detail=LONG_DETAIL,
                options=options("Approve", "Request changes"),
                intent=PlanReviewIntent(approve="Approve"),
            ),
        )
        request = card(page, "Prune old releases?")
        await expect(request).to_be_visible()
        width = await page.evaluate("document.documentElement.scrollWidth")
        wide = await page.evaluate(
            "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391)"
            ".map(e => e.tagName + '.' + e.className).slice(0, 8)"
        )
        assert width <= 390, (width, wide)  # long paths, hashes, tables and code wrap or scroll in their box
        header = await page.locator("header.top").bounding_box()
        assert header is not None and header["height"] < 110  # two rows at most
        for box in await request.locator("button").evaluate_all(
            "bs => bs.map(b => b.getBoundingClientRect()).map(r => [r.width, r.height])"
        ):
            assert box[0] >= 24 and box[1] >= 24, box
        await page.screenshot(path=screenshots / "12-mobile-plan.png", full_page=True)
        form = ask(
            asker,
            AskUserQuestionItem(id="a", question="Tap targets?", options=options("x", "y")),
            AskUserQuestionItem(id="b", question="Second?", options=options("p"), multi_select=True),
        )
        taps = card(page, "Tap targets?")
        await expect(taps).to_be_visible()
        sizes = await taps.locator("input, button").evaluate_all(
            "xs => xs.map(x => x.getBoundingClientRect()).map(r => [Math.round(r.width), Math.round(r.height)])"
        )
        assert all(w >= 24 and h >= 24 for w, h in sizes), sizes
        form.cancel()
        await request.get_by_role("button", name="Request changes").click()
        await request.locator("textarea.decline-note").fill("keep ten releases, not five")
        await page.screenshot(path=screenshots / "13-mobile-decline.png", full_page=True)
        await request.get_by_role("button", name="Send: Request changes").click()
        assert (await asked).answers[0].custom == "keep ten releases, not five"


AXE = Path(os.environ.get("QBROKER_AXE", Path(__file__).parent / "node_modules" / "axe-core" / "axe.min.js"))


async def axe_violations(page: Page) -> list[str]:
    await page.add_script_tag(path=AXE)
    results = await page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    assert results["testEngine"]["name"] == "axe-core"
    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
        for v in results["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.skipif(not AXE.exists(), reason="axe-core missing: `npm ci` in tests/web, or set QBROKER_AXE")
async def test_no_serious_accessibility_violations(browser: Browser, web: WebProcess, asker: Broker) -> None:
    context = await browser.new_context(viewport={"width": 1000, "height": 900}, bypass_csp=True)  # to inject axe
    try:
        page = await context.new_page()
        await page.goto(web.url)
        await expect(page.locator("#sign-in")).to_be_visible()
        assert await axe_violations(page) == []
        await fill_sign_in(page, "alice")
        planned = ask(asker, plan("Accessible plan?", "Approve", "Request changes", approve="Approve"))
        batch = ask(
            asker,
            AskUserQuestionItem(id="a", question="First of two?", header="Pair", options=options("x", "y")),
            AskUserQuestionItem(id="b", question="Second of two?", options=options("p", "q"), multi_select=True),
        )
        await expect(card(page, "Accessible plan?")).to_be_visible()
        await expect(card(page, "First of two?")).to_be_visible()
        await card(page, "Accessible plan?").get_by_role("button", name="Request changes").click()
        pair = card(page, "First of two?")
        await pair.get_by_role("button", name="Don't ask again…").click()
        await pair.get_by_role("button", name="Dismiss all 2").click()
        await pair.get_by_text("Other…").first.click()
        await expect(page.locator("#filters")).to_be_visible()
        assert await axe_violations(page) == []
        await page.get_by_role("button", name="History").click()
        await expect(page.locator("#history-view")).to_be_visible()
        assert await axe_violations(page) == []
        planned.cancel()
        batch.cancel()
    finally:
        await context.close()


async def test_opt_in_desktop_notification(browser: Browser, web: WebProcess, asker: Broker) -> None:
    context = await browser.new_context(viewport={"width": 1000, "height": 900})
    await context.grant_permissions(["notifications"], origin=web.url)
    try:
        page = await context.new_page()
        await page.goto(web.url)
        await fill_sign_in(page, "bob")
        notify = page.get_by_role("button", name="Notify")
        await expect(notify).to_have_attribute("aria-pressed", "false")  # off until asked for
        await notify.click()
        await expect(page.locator("#notify")).to_have_attribute("aria-pressed", "true")
        assert await page.evaluate("localStorage.getItem('qb-notify')") == "on"
        # The tab goes to the background; record what the page shows through the real API.
        await page.evaluate(
            """() => {
                Object.defineProperty(document, 'hidden', {get: () => true});
                const Real = window.Notification;
                window.__shown = [];
                window.Notification = class extends Real {
                    constructor(title, options) { super(title, options); window.__shown.push([title, options.body]); }
                };
                window.Notification.permission = Real.permission;
            }"""
        )
        asked = ask(asker, AskUserQuestionItem(id="q", question="Did you hear me?", options=options("yes")))
        await expect(card(page, "Did you hear me?")).to_be_visible()
        assert await page.evaluate("window.__shown") == [["Question from an agent", "Did you hear me?"]]
        asked.cancel()
    finally:
        await context.close()


async def test_revoked_session_returns_to_sign_in(people: People, asker: Broker) -> None:
    page = await people.page("bob")
    revoked = await asyncio.to_thread(qbroker, people.web.redis_url, people.web.namespace, "revoke", "--user", "bob")
    assert revoked.returncode == 0, revoked.stderr
    asked = ask(asker, AskUserQuestionItem(id="q", question="Bob may not see this?", options=options("a")))
    await expect(page.locator("#sign-in-error")).to_have_text("Your session ended; sign in again.", timeout=10_000)
    await expect(page.locator("article.card")).to_have_count(0)
    asked.cancel()


async def test_one_page_for_several_namespaces(
    browser: Browser, redis_server: RedisServer, tmp_path: Path, screenshots: Path
) -> None:
    first, second = f"ns1-{os.getpid()}", f"ns2-{os.getpid()}"
    users = write_users_file(tmp_path / "u.toml")
    holder = WebProcess(redis_server.url, first, users, tmp_path / "a.log", name="web-a")
    holder.extra = ["--public-url", f"http://127.0.0.1:{holder.port}/"]
    holder.start()  # holds the first namespace's lease
    both = WebProcess(redis_server.url, first, users, tmp_path / "b.log", name="web-b", extra=["--serve", second])
    both.start()  # stands by for the first, serves the second
    people = People(browser, both)
    try:
        page = await people.page()
        async with (
            Broker(redis_server.url, first, **KEYS) as asker_one,
            Broker(redis_server.url, second, **KEYS) as asker_two,
        ):
            asked = ask(asker_two, AskUserQuestionItem(id="q", question="From the second?", options=options("ok")))
            elsewhere = ask(asker_one, AskUserQuestionItem(id="q", question="From the first?", options=options("ok")))
            request = card(page, "From the second?")
            await expect(request.locator(".namespace-chip")).to_have_text(second)
            await expect(page.locator("#banner")).to_contain_text(f"Standing by: web-a is serving {first}")
            await expect(page.locator("#banner .holder-link")).to_have_attribute("href", holder.url + "/")
            await expect(card(page, "From the first?")).to_have_count(0)  # answered on web-a
            await expect(page).to_have_title(re.compile(rf"^\(1\) Questions · {first}, {second}"))
            await page.screenshot(path=screenshots / "14-two-namespaces.png", full_page=True)
            await request.get_by_text("ok", exact=True).click()
            await request.get_by_role("button", name="Send answer").click()
            assert (await asked).answers[0].selected == ("ok",)
            elsewhere.cancel()
    finally:
        await people.close()
        both.stop()
        holder.stop()


async def test_answer_and_remember_then_list_and_revoke(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    rotate = AskUserQuestionItem(id="rotate", question="Rotate the staging keys?", header="Ops",
                                 options=options("yes", "no"))  # fmt: skip
    async with asker.agent("rotator-1") as rotator:
        asked = ask(asker, rotate, agent="rotator-1")
        request = card(page, "Rotate the staging keys?")
        await expect(request).to_be_visible()
        scope = request.locator("select.remember-scope")
        await expect(scope.locator("option")).to_have_text(
            ["Just this once", "Remember for agent rotator-1", f"Remember for everyone in {asker.namespace}"]
        )
        await expect(scope).to_be_hidden()  # behind one click
        await request.get_by_role("button", name="Don't ask again…").click()
        await expect(request.locator("select.remember-ttl")).to_be_hidden()
        await request.get_by_text("yes", exact=True).click()
        await scope.select_option("namespace")
        await request.locator("select.remember-ttl").select_option("86400")
        await page.screenshot(path=screenshots / "20-remember-on-a-card.png", full_page=True)
        await request.get_by_role("button", name="Send answer").click()
        assert (await asked).answers[0].selected == ("yes",)
        # asked again, with another id: answered at once, no card
        again = await rotator.ask(AskUserQuestionRequest(questions=(msgspec_replace(rotate, id="again"),)), timeout=5)
        assert again.answers[0].id == "again" and again.answers[0].selected == ("yes",)

    await page.get_by_role("button", name="Remembered").click()
    item = page.locator("#remembered li.remembered-item")
    await expect(item).to_have_count(1)
    await expect(item).to_contain_text("Ops · Rotate the staging keys? → yes")
    await expect(item).to_contain_text(f"for everyone in {asker.namespace}")
    await expect(item).to_contain_text("set by alice via web-1")
    await expect(item.locator(".expires")).to_have_text(re.compile(r"^expires in (1 d|23 h 59 min)$"))
    await page.screenshot(path=screenshots / "21-remembered.png", full_page=True)
    await item.get_by_role("button", name="Revoke").click()
    await expect(item).to_have_count(0)
    await expect(page.locator("#remembered-empty")).to_be_visible()
    assert await asker.decisions() == []

    # an asker that opted out gets no offer
    await page.get_by_role("button", name="Pending").click()
    opted = asyncio.create_task(asker.ask(AskUserQuestionRequest(questions=(rotate,)), remember=False, timeout=50))
    request = card(page, "Rotate the staging keys?")
    await expect(request).to_be_visible()
    await expect(request.locator("select.remember-scope")).to_have_count(0)
    await request.get_by_text("no", exact=True).click()
    await request.get_by_role("button", name="Send answer").click()
    assert (await opted).answers[0].selected == ("no",)


async def test_a_stray_key_never_approves_a_plan(people: People, asker: Broker) -> None:
    # The plan arrives first (first in arrival order), the urgent question second (first on screen).
    planned = ask(asker, plan("Run the 25-step migration?", "Approve", "Request changes", approve="Approve"))
    page = await people.page()
    await expect(card(page, "Run the 25-step migration?")).to_be_visible()
    urgent = ask(
        asker,
        AskUserQuestionItem(id="q", question="Restart the cache now?", options=options("restart", "wait")),
        priority="urgent",
    )
    first = card(page, "Restart the cache now?")
    await expect(page.locator("article.card").first).to_contain_text("Restart the cache now?")
    await page.keyboard.press("1")  # nothing focused: the first card on screen
    await page.keyboard.press("Enter")
    await page.wait_for_timeout(500)
    assert not planned.done()
    assert not urgent.done()
    await expect(first.locator("input.option").first).to_be_checked()
    # Inside the plan card, digits and Enter do not approve it either.
    review = card(page, "Run the 25-step migration?")
    await review.locator(".question-text").click()
    for key in ("1", "Enter", "1", "Enter", "Space"):
        await page.keyboard.press(key)
    await page.wait_for_timeout(500)
    assert not planned.done()
    await expect(review).to_be_visible()
    planned.cancel()
    urgent.cancel()
    await asyncio.gather(planned, urgent, return_exceptions=True)


async def test_keys_act_on_the_first_card_in_the_window_not_one_scrolled_away(people: People, asker: Broker) -> None:
    page = await people.page()
    await page.set_viewport_size({"width": 1000, "height": 400})
    asks = [
        ask(asker, AskUserQuestionItem(id="q", question=f"Scrolled {n}?", options=options("x", "y"))) for n in (1, 2, 3)
    ]
    await expect(page.locator("article.card")).to_have_count(3)
    await card(page, "Scrolled 2?").evaluate("node => node.scrollIntoView({block: 'start'})")
    await page.keyboard.press("2")
    await expect(card(page, "Scrolled 2?").locator("input.option").nth(1)).to_be_checked()
    await expect(card(page, "Scrolled 1?").locator("input.option:checked")).to_have_count(0)
    for task in asks:
        task.cancel()
    await asyncio.gather(*asks, return_exceptions=True)


STEPS = "# Migration\n\n" + "\n".join(
    f"{n}. step {n}: move table t{n} to the new schema and check it" for n in range(1, 26)
)


async def height(locator: Locator) -> float:
    box = await locator.bounding_box()
    assert box is not None
    return float(box["height"])


async def test_cards_are_compact_and_a_long_plan_is_collapsed(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    yes_no = ask(asker, AskUserQuestionItem(id="q", question="Merge the branch?", options=options("yes", "no")))
    long_plan = AskUserQuestionItem(
        id="plan", question="Run the migration?", detail=STEPS, options=options("Approve", "Request changes"),
        intent=PlanReviewIntent(approve="Approve"),
    )  # fmt: skip
    migration = ask(asker, long_plan)
    small = card(page, "Merge the branch?")
    await expect(small).to_be_visible()
    assert await height(small) < 230  # was 370: no open text box, no remember menu
    await expect(small.locator("textarea.other")).to_be_hidden()
    big = card(page, "Run the migration?")
    await expect(big.locator(".detail li").first).to_be_visible()
    collapsed = await height(big)
    assert collapsed < 400, collapsed
    await page.screenshot(path=screenshots / "22-compact.png", full_page=True)
    # Approve on a collapsed plan shows the whole plan first; only a second press sends.
    await big.get_by_role("button", name="Approve").click()
    await expect(big.get_by_role("button", name="Show less")).to_be_visible()
    assert await height(big) > collapsed + 300
    await page.wait_for_timeout(300)
    assert not migration.done()
    await big.get_by_role("button", name="Approve").click()
    assert (await asyncio.wait_for(migration, 10)).answers[0].selected == ("Approve",)
    await small.get_by_text("yes", exact=True).click()
    await small.get_by_role("button", name="Send answer").click()
    assert (await asyncio.wait_for(yes_no, 10)).answers[0].selected == ("yes",)


async def test_filters_over_the_loaded_cards(people: People, asker: Broker) -> None:
    page = await people.page()
    async with asker.agent("filter-a"), asker.agent("filter-b"):
        asks = [
            ask(asker, AskUserQuestionItem(id="q", question="From a?", options=options("x")), agent="filter-a"),
            ask(asker, AskUserQuestionItem(id="q", question="From b?", options=options("x")), agent="filter-b",
                priority="urgent"),
            ask(asker, plan("Plan of b?", "Approve", "Refuse", approve="Approve"), agent="filter-b"),
        ]  # fmt: skip
        await expect(page.locator("article.card")).to_have_count(3)
        await page.get_by_label("Filter by agent").select_option("filter-b")
        await expect(page.locator("article.card:visible")).to_have_count(2)
        await expect(page.locator("#filter-count")).to_have_text("2 of 3 shown")
        await page.get_by_label("Filter by kind").select_option("plan-review")
        await expect(page.locator("article.card:visible")).to_have_count(1)
        await expect(page.locator("article.card:visible")).to_contain_text("Plan of b?")
        await page.get_by_label("Filter by kind").select_option("")
        await page.get_by_label("Filter by priority").select_option("urgent")
        await expect(page.locator("article.card:visible")).to_have_count(1)
        await expect(page.locator("article.card:visible")).to_contain_text("From b?")
        await page.keyboard.press("1")  # keys act on the first card shown
        await expect(card(page, "From b?").locator("input.option").first).to_be_checked()
        await expect(card(page, "From a?").locator("input.option").first).not_to_be_checked()
        await page.get_by_role("button", name="Show all").click()
        await expect(page.locator("article.card:visible")).to_have_count(3)
        for task in asks:
            task.cancel()
        await asyncio.gather(*asks, return_exceptions=True)


async def test_phone_header_is_whole_and_no_digit_badges(
    browser: Browser, web: WebProcess, asker: Broker, screenshots: Path
) -> None:
    async with phone(browser, web) as page:
        asked = ask(asker, AskUserQuestionItem(id="q", question="On the phone?", options=options("yes", "no")))
        await expect(card(page, "On the phone?")).to_be_visible()
        for selector in ("#sign-out", "#who", "#namespace", "#show-pending", "#show-history", "#show-remembered"):
            item = page.locator(selector)
            await expect(item).to_be_visible()
            cut = await item.evaluate(
                "e => { const r = e.getBoundingClientRect();"
                " return e.scrollWidth > e.clientWidth + 1 || r.right > innerWidth || r.left < 0; }"
            )
            assert not cut, selector
        await expect(page.locator("#sign-out")).to_have_text("Sign out")
        await expect(page.locator("#who")).to_have_text("alice")
        await expect(page.locator("kbd.digit").first).to_be_hidden()  # no keyboard, no key badges
        await expect(page.locator("#keys-hint")).to_be_hidden()
        await page.screenshot(path=screenshots / "23-phone-header.png")
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)


async def test_a_redis_outage_is_named_at_once_and_a_card_withdrawn_meanwhile_leaves_a_note(
    browser: Browser, redis_factory: Callable[..., RedisServer], tmp_path: Path, screenshots: Path
) -> None:
    redis = redis_factory()
    namespace = f"outage{os.getpid()}"
    async with own_web(browser, redis.url, namespace, tmp_path) as (web, people):
        page = await people.page()
        async with Broker(redis.url, namespace, **KEYS) as asker:
            stays = ask(
                asker, AskUserQuestionItem(id="q", question="Still wanted later?", options=options("yes", "no"))
            )
            goes = ask(asker, AskUserQuestionItem(id="q", question="Withdrawn meanwhile?", options=options("yes")))
            await expect(page.locator("article.card")).to_have_count(2)
            banner = page.locator("#banner")
            redis.pause()  # the web server is fine; its Redis stops answering
            try:
                await expect(banner).to_contain_text("The server is up, but its Redis", timeout=6_000)
                await expect(banner).not_to_contain_text("Disconnected from the server")
                health = await people.contexts[0].request.get(web.url + "/healthz")
                assert (await health.json())["redis"] == "down"
                still = card(page, "Still wanted later?")
                await expect(still.get_by_role("button", name="Send answer")).to_be_disabled()
                await page.screenshot(path=screenshots / "24-redis-down.png", full_page=True)
                goes.cancel()  # the agent gives up while Redis is away
            finally:
                redis.resume()
            await expect(page.locator(".settled-note")).to_contain_text(
                "Withdrawn meanwhile? — Withdrawn: its asker stopped waiting (gave up, or its process ended).",
                timeout=20_000,
            )
            await expect(banner).to_be_hidden()
            await expect(still.get_by_role("button", name="Send answer")).to_be_enabled(timeout=20_000)
            await still.get_by_text("yes", exact=True).click()
            await still.get_by_role("button", name="Send answer").click()
            assert (await asyncio.wait_for(stays, 10)).answers[0].selected == ("yes",)
            await asyncio.gather(goes, return_exceptions=True)


async def test_own_send_is_confirmed_and_a_dismissal_carries_its_reason(people: People, asker: Broker) -> None:
    page = await people.page()
    async with asker.agent("builder-9"):
        asked = ask(asker, AskUserQuestionItem(id="q", question="Tag the release?", options=options("tag", "hold")),
                    agent="builder-9")  # fmt: skip
        request = card(page, "Tag the release?")
        await request.get_by_text("tag", exact=True).click()
        await request.get_by_role("button", name="Send answer").click()
        await expect(request).to_have_count(0)
        await expect(page.locator(".sent-note")).to_have_text("Tag the release? — Sent to builder-9: tag.")
        assert (await asked).answers[0].selected == ("tag",)
    dismissed = ask(asker, AskUserQuestionItem(id="q", question="Drop the cache?", options=options("yes", "no")))
    request = card(page, "Drop the cache?")
    await request.get_by_role("button", name="Dismiss question").click()
    await request.get_by_label("Reason for dismissing (optional)").fill("ask again after the freeze")
    await request.get_by_role("button", name="Yes, dismiss it").click()
    await expect(request).to_have_count(0)
    await expect(page.locator(".sent-note").first).to_have_text(
        "Drop the cache? — Dismissed: ask again after the freeze."
    )
    with pytest.raises(UserQuestionError) as caught:
        await dismissed
    assert caught.value.code == "ASK_CANCELLED"
    assert "alice dismissed the question: ask again after the freeze" in caught.value.message


async def test_a_load_asks_for_nothing_missing_and_inline_code_is_code(people: People, asker: Broker) -> None:
    missing: list[str] = []
    page = await people.page(user=None)
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    await page.reload()
    await fill_sign_in(page, "alice")
    item = AskUserQuestionItem(
        id="q",
        question="Allow Bash: `make test` in `/srv/app`?",
        header="Claude Code",
        options=options("Allow", "Deny"),
    )
    asked = ask(asker, item)
    request = card(page, "Allow Bash")
    await expect(request.locator(".question-text code")).to_have_text(["make test", "/srv/app"])
    assert "`" not in await request.locator(".question-text").inner_text()
    await page.wait_for_load_state("networkidle")
    assert missing == []
    # Chromium does not report its favicon fetch to the page: ask for what it would.
    icon = await page.locator("link[rel=icon]").evaluate("link => link.href")
    for url in (icon, people.web.url + "/favicon.ico"):
        response = await page.request.get(url)
        assert response.status == 200, url
        assert response.headers["content-type"].startswith("image/"), url
    asked.cancel()
    await asyncio.gather(asked, return_exceptions=True)
