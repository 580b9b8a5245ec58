"""The page's History and state from what Redis keeps, in Chromium with real ``qbroker web`` processes.

History reads the audit (who answered what), not what one web process remembers: after a restart, and for
what a terminal or another server answered, it still shows each question's text, its asker and the verdict.
A Redis restart that lost its data leaves the page in one clear state (sign in again), no stale banner.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect
from redis.asyncio import Redis

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionItem, Broker
from broker._keys import Keys
from tests.helpers import KEYS
from tests.redis_server import RedisServer
from tests.web import test_browser as shared
from tests.web.conftest import WebProcess, write_users_file
from tests.web.test_browser import HeldRoute, People, ask, card, fill_sign_in, options, own_web, plan
from tests.workers.procs import run_qbroker

pytestmark = shared.BROWSER_MARKS


browser = shared.browser  # test_browser's fixture, each module its own


async def answer_in_a_terminal(redis_url: str, namespace: str, by: str, holding: asyncio.Event) -> None:
    """What ``qbroker provide`` does: hold the lease, answer the first card shown, as ``by``."""
    async with Broker(redis_url, namespace, lease_ttl=2, **KEYS) as terminal, terminal.provider(by) as provider:
        holding.set()
        async for pending in provider:
            item = pending.request.questions[0]
            await pending.answer(
                AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id=item.id, selected=("Now",)),)), by=by
            )
            return


async def answered_in_a_terminal(
    asker: Broker, redis_url: str, namespace: str, item: AskUserQuestionItem, *, agent: str | None = None
) -> None:
    """``item`` asked (by ``agent``), once a terminal holds the lease, and answered there 'Now' by carol@laptop."""
    holding = asyncio.Event()
    terminal = asyncio.create_task(answer_in_a_terminal(redis_url, namespace, "carol@laptop", holding))
    await holding.wait()
    asked = ask(asker, item, agent=agent)
    await terminal
    await asked


@pytest.mark.timeout(50)
async def test_history_after_a_restart_and_of_a_terminal_answer_reads_the_durable_record(
    browser: Browser, redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    """Row 4: after `qbroker web` restarts, History read 'question q1 -> Approve': no text, no asker, no verdict."""
    redis = redis_factory()
    namespace = f"history{os.getpid()}"
    users = write_users_file(tmp_path / "u.toml")
    first = WebProcess(redis.url, namespace, users, tmp_path / "w1.log", name="web-1").start()
    second = WebProcess(redis.url, namespace, users, tmp_path / "w2.log", name="web-2")
    people = People(browser, first)
    try:
        async with (
            asyncio.timeout(40),
            Broker(redis.url, namespace, **KEYS) as asker,
            asker.agent("planner-3"),
            asker.agent("builder-7"),
            asker.agent("ops-1"),
        ):
            page = await people.page()
            approved = ask(
                asker, plan("Ship the migration plan?", "Go ahead", "Refuse", approve="Go ahead"), agent="planner-3"
            )
            await card(page, "Ship the migration plan?").get_by_role("button", name="Go ahead").click()
            await approved
            chosen = ask(
                asker,
                AskUserQuestionItem(id="q1", question="Which region first?", options=options("eu", "us")),
                agent="builder-7",
            )
            request = card(page, "Which region first?")
            await request.get_by_text("eu", exact=True).click()
            await request.get_by_role("button", name="Send answer").click()
            await chosen
            await people.close()
            await asyncio.to_thread(first.stop)  # the page's server restarts: what it remembered is gone

            rotate = AskUserQuestionItem(id="r", question="Rotate the keys?", options=options("Now", "Later"))
            await answered_in_a_terminal(asker, redis.url, namespace, rotate, agent="ops-1")

            await asyncio.to_thread(second.start)
            people = People(browser, second)
            page = await people.page()
            await page.click("#show-history")
            history = page.locator("#history li.history-item")
            await expect(history).to_have_count(3)
            planned = history.filter(has_text="Ship the migration plan?")
            await expect(planned).to_contain_text("→ approved")
            await expect(planned).to_contain_text("asked by planner-3")
            await expect(planned).to_contain_text("by alice")
            region = history.filter(has_text="Which region first?")
            await expect(region).to_contain_text("→ eu")
            await expect(region).to_contain_text("asked by builder-7")
            rotation = history.filter(has_text="Rotate the keys?")
            await expect(rotation).to_contain_text("→ Now")
            await expect(rotation).to_contain_text("asked by ops-1 (claimed)")
            await expect(rotation).to_contain_text("by carol@laptop")
    finally:
        await people.close()
        first.stop()
        second.stop()


async def sealed_by(redis_url: str, namespace: str, name: str, *, after: bool = False) -> None:
    """Until a checkpoint by the provider ``name`` is in the audit (naming an earlier one, with ``after``)."""
    keys = Keys(namespace)
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        while not any(
            fields.get("event") == "checkpoint"
            and fields.get("provider") == name
            and (fields.get("after") or not after)
            for _, fields in await client.xrange(keys.audit)
        ):
            await asyncio.sleep(0.1)
    finally:
        await client.aclose()


@pytest.mark.timeout(50)
async def test_a_redis_restart_that_lost_the_data_leaves_one_clear_state_and_verify_says_so(
    browser: Browser, redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    """Row 5: 'Session ended' under a stale red 'Reconnecting...' banner; verify said INTACT (the beginning)."""
    redis = redis_factory()
    namespace = f"lost{os.getpid()}"
    async with asyncio.timeout(40), Broker(redis.url, namespace, **KEYS) as asker:
        rotate = AskUserQuestionItem(id="r", question="Rotate the keys?", options=options("Now"))
        await answered_in_a_terminal(asker, redis.url, namespace, rotate)
    probe = HeldRoute()  # the page asks /healthz as its stream breaks; that answer comes late, as under load
    async with own_web(browser, redis.url, namespace, tmp_path, release=probe.released) as (_, people):
        async with asyncio.timeout(40):
            await sealed_by(redis.url, namespace, "web-1")  # it sealed the audit as it took the lease
            page = await people.page()
            await expect(page.locator("#empty")).to_contain_text("No pending questions")
            await page.route("**/healthz", probe)
            await asyncio.to_thread(redis.restart)  # no persistence: sessions, audit, everything is gone
            await expect(page.locator("#sign-in")).to_be_visible(timeout=20_000)
            await expect(page.locator("#banner")).to_be_hidden()
            await expect(page.locator("#sign-in-error")).to_contain_text("lost its data")
            assert probe.seen.is_set(), "the broken stream was never probed"
            async with page.expect_request_finished(lambda request: request.url.endswith("/healthz")):
                probe.released.set()  # the probe of the broken stream answers only now, after the page signed out
            await page.evaluate("() => new Promise((resolve) => setTimeout(resolve, 0))")  # the page has read it
            await expect(page.locator("#banner")).to_be_hidden()
            await sealed_by(redis.url, namespace, "web-1", after=True)  # serving again: it sealed the new audit
            await expect(page.locator("#banner")).to_be_hidden()
            await expect(page.locator("#sign-in-error")).to_contain_text("lost its data")

            status, out, _ = await run_qbroker("audit", "verify", url=redis.url, namespace=namespace)
            text = out.decode()
            assert status == 20, text
            assert "(the history before it is gone" in text and "(the beginning of the chain)" not in text

            await fill_sign_in(page, "alice")
            await expect(page.locator("#empty")).to_contain_text("No pending questions")
            await expect(page.locator("#banner")).to_be_hidden()


@pytest.mark.timeout(50)
async def test_the_page_says_when_history_was_not_searched_to_its_end(
    browser: Browser, redis_factory: Callable[..., RedisServer], tmp_path: Path
) -> None:
    """4 400 events of cards routed to sre, bob outside it: History's request stops at its read bound (4 000) with
    nothing for him, and the page says older entries were not searched rather than "Nothing settled yet."."""
    from tests.web.test_history_routed import POLICY, _settled_in_the_audit

    redis = redis_factory()
    namespace = f"bounded{os.getpid()}"
    users = write_users_file(tmp_path / "users.toml")
    users.write_text(users.read_text() + '[groups]\nsre = ["alice"]\n')
    (tmp_path / "policy.toml").write_text(POLICY)
    web = WebProcess(
        redis.url, namespace, users, tmp_path / "web.log", extra=["--policy-file", str(tmp_path / "policy.toml")]
    )
    async with Redis.from_url(redis.url, decode_responses=True) as client:
        await _settled_in_the_audit(client, namespace, 4_000, ["sre"], "sre")
    people = People(browser, web.start())
    try:
        page = await people.page("bob")
        await page.click("#show-history")
        await expect(page.locator("#history-truncated")).to_be_visible()
        await expect(page.locator("#history-empty")).to_be_hidden()
        await expect(page.locator("#history li.history-item")).to_have_count(0)
    finally:
        await people.close()
        web.stop()
