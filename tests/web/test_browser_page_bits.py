"""What a new team meets on the page, in headless Chromium at 1280x800 and 390x844 (issue "The page a team
trusts at fleet size", rows 7 and 9): a whole attachment readable and wrapped, with its size and digest; an
empty sign-in says what is missing; a server stopped on purpose reads as stopped, not as a red disconnection.
Fixtures shared with tests/web/test_browser.py."""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect

from broker import Broker
from broker_adapters._approvals import ToolCall, _args_text, approval_request
from tests.redis_server import RedisServer
from tests.web import test_browser as shared
from tests.web.conftest import WebProcess, write_users_file
from tests.web.test_browser import VIEWPORTS, ask, card, fill_sign_in, sign_in

web, asker, browser, screenshots = shared.web, shared.asker, shared.browser, shared.screenshots

pytestmark = [*shared.BROWSER_MARKS, pytest.mark.timeout(50)]

Opener = Callable[..., Awaitable[Page]]


@pytest_asyncio.fixture(loop_scope="module")
async def open_page(browser: Browser) -> AsyncIterator[Opener]:
    """A page of ``url`` at a viewport (``desktop`` or ``mobile``), signed in as ``user`` unless None."""
    contexts = []

    async def open_(url: str, viewport: str, user: str | None = "alice") -> Page:
        mobile = viewport == "mobile"
        context = await browser.new_context(viewport=VIEWPORTS[viewport], is_mobile=mobile, has_touch=mobile)
        contexts.append(context)
        page = await context.new_page()
        await page.goto(url)
        if user is not None:
            await sign_in(page, user)
        return page

    yield open_
    for context in contexts:
        await context.close()


# -- row 9: an attachment of 211 kB ------------------------------------------------------------


@pytest.mark.parametrize("viewport", ["desktop", "mobile"])
async def test_a_large_attachment_is_wrapped_with_its_size_and_digest(
    open_page: Opener, asker: Broker, web: WebProcess, screenshots: Path, viewport: str
) -> None:
    """Issue row 9: 211 kB of arguments showed as one line scrolling sideways, with an empty gap below."""
    tail = f"the-very-end-of-the-patch-{viewport}"
    patch = "".join(f"+line {n}: {'word ' * 12}\n" for n in range(2_900)) + tail  # one JSON string: one line
    whole = _args_text({"patch": patch})
    size = len(whole.encode())
    assert 200_000 < size < 220_000
    digest = hashlib.sha256(whole.encode()).hexdigest()
    (item,) = approval_request([ToolCall(f"call-{viewport}", "apply_patch", {"patch": patch})]).questions
    assert item.attachment is not None and item.attachment.sha256 == digest
    await asker.attach(whole)
    page = await open_page(web.url, viewport)
    asked = ask(asker, item)
    try:
        request = card(page, "Allow apply_patch")
        await request.get_by_role("button", name=f"Show all {size:,} bytes").click()
        shown = request.locator(".attachment")
        text = shown.locator("pre.attachment-text")
        await expect(text).to_contain_text(tail)
        await text.scroll_into_view_if_needed()
        await page.screenshot(path=screenshots / f"attachment-{viewport}.png")
        await expect(shown.locator(".attachment-about")).to_contain_text(f"{size:,} bytes")
        await expect(shown.locator(".attachment-about")).to_contain_text(digest)
        box = await text.evaluate(
            """(pre) => {
                const attachment = pre.closest(".attachment").getBoundingClientRect();
                const r = pre.getBoundingClientRect();
                return {scrollWidth: pre.scrollWidth, clientWidth: pre.clientWidth,
                        scrollHeight: pre.scrollHeight, clientHeight: pre.clientHeight,
                        gapBelow: attachment.bottom - r.bottom,
                        pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
                        lineHeight: parseFloat(getComputedStyle(pre).lineHeight) || 20}
            }"""
        )
        assert box["scrollWidth"] <= box["clientWidth"] + 1, box  # wrapped: nothing to scroll sideways to
        assert box["pageWidth"] <= box["viewport"], box  # nor does the page
        assert box["scrollHeight"] > 3 * box["clientHeight"], box  # long: the box scrolls down, filled
        assert box["clientHeight"] >= 10 * box["lineHeight"], box  # tall enough to read in
        assert box["gapBelow"] < 4, box  # no empty band under it (it was a blank line)
    finally:
        asked.cancel()


# -- row 7 (b): an empty sign-in --------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "password", "says"),
    [
        ("", "", "Type your user name and password"),
        ("alice", "", "Type your password"),
        ("", "alice-password", "Type your user name"),
    ],
    ids=["both-empty", "no-password", "no-user"],
)
async def test_an_empty_sign_in_says_what_is_missing(
    open_page: Opener, web: WebProcess, screenshots: Path, user: str, password: str, says: str
) -> None:
    """Issue row 7: an empty sign-in said 'wrong user name, password or token'."""
    page = await open_page(web.url, "mobile", user=None)
    sent: list[str] = []
    page.on("request", lambda request: sent.append(request.url) if request.method == "POST" else None)
    await fill_sign_in(page, user, password)
    await expect(page.locator("#sign-in-error")).to_have_text(says + ".")
    assert sent == []  # said on the page: no attempt spent, nothing to throttle
    await page.screenshot(path=screenshots / f"sign-in-user-{bool(user)}-password-{bool(password)}.png")
    await fill_sign_in(page, "alice")
    await expect(page.locator("#main")).to_be_visible()


# -- row 7 (c): a server stopped on purpose ---------------------------------------------------


@pytest.mark.parametrize("viewport", ["desktop", "mobile"])
async def test_a_server_stopped_on_purpose_reads_as_stopped_not_disconnected(
    open_page: Opener, redis_server: RedisServer, tmp_path: Path, screenshots: Path, viewport: str
) -> None:
    """Issue row 7: the demo ended 1 s after the last answer and left a red 'Disconnected' on the page."""
    users = write_users_file(tmp_path / "users.toml")
    stopped = WebProcess(redis_server.url, f"stopping-{viewport}-{os.getpid()}", users, tmp_path / "web.log").start()
    try:
        page = await open_page(stopped.url, viewport)
        await expect(page.locator("body")).to_have_attribute("data-connected", "yes")
        assert stopped.process is not None
        stopped.process.send_signal(signal.SIGTERM)  # what `make demo` and quickstart send it on the way out
        stopped.process.wait(15)
        banner = page.locator("#banner")
        await expect(banner).to_contain_text("The server was stopped on purpose")
        await expect(banner).not_to_have_class("bad")
        await expect(banner).not_to_contain_text("Disconnected")
        await page.wait_for_timeout(3_000)  # the browser's own retries fail meanwhile: still calm
        await expect(banner).to_contain_text("The server was stopped on purpose")
        await expect(banner).not_to_have_class("bad")
        await page.screenshot(path=screenshots / f"stopped-{viewport}.png")
        stopped.start()  # the same port again: the page comes back by itself
        await expect(page.locator("body")).to_have_attribute("data-connected", "yes", timeout=20_000)
        await expect(banner).to_be_hidden()
    finally:
        stopped.stop()
