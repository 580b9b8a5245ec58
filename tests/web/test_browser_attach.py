"""Arguments too large for a card, in headless Chromium: the card shows them cut, and "Show all N bytes"
fetches the attachment its question names. Fixtures shared with tests/web/test_browser.py."""

from __future__ import annotations

import pytest
from playwright.async_api import expect
from redis.asyncio import Redis

from broker import Broker
from broker._keys import Keys
from broker_adapters._approvals import ToolCall, _args_text, approval_request
from tests.web import test_browser as shared
from tests.web.conftest import WebProcess
from tests.web.test_browser import People, ask, card

web, asker, browser, people = shared.web, shared.asker, shared.browser, shared.people

pytestmark = [*shared.BROWSER_MARKS, pytest.mark.timeout(50)]


async def test_show_all_fetches_the_whole_arguments(people: People, asker: Broker) -> None:
    tail = "the-very-end-of-the-patch"
    whole = "+" + "x" * 80_000 + tail
    (item,) = approval_request([ToolCall("call-big", "apply_patch", {"patch": whole})]).questions
    assert item.attachment is not None
    await asker.attach(_args_text({"patch": whole}))  # what the adapters attach
    page = await people.page()
    asked = ask(asker, item)
    request = card(page, "Allow apply_patch")
    await expect(request).to_be_visible()
    await expect(request).not_to_contain_text(tail)  # cut on the card
    button = request.get_by_role("button", name=f"Show all {item.attachment.size:,} bytes")
    await button.click()
    await expect(request.locator("pre.attachment-text")).to_contain_text(tail)
    asked.cancel()


async def test_a_swapped_attachment_is_not_shown(people: People, asker: Broker, web: WebProcess) -> None:
    whole = "y" * 70_000
    (item,) = approval_request([ToolCall("call-swap", "write_file", {"text": whole})]).questions
    assert item.attachment is not None
    redis = Redis.from_url(web.redis_url, decode_responses=True)
    try:
        await redis.set(Keys(asker.namespace).attachment(item.attachment.sha256), "rm -rf / # not what was named")
    finally:
        await redis.aclose()
    page = await people.page()
    asked = ask(asker, item)
    request = card(page, "Allow write_file")
    await request.get_by_role("button", name=f"Show all {item.attachment.size:,} bytes").click()
    await expect(request.locator(".attachment-note")).to_contain_text("No longer kept")
    await expect(request).not_to_contain_text("rm -rf")
    asked.cancel()
