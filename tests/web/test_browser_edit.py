"""Edit before approve on the answer page, in headless Chromium: the human edits a call's arguments
as JSON, the page and then the server check them against the tool's schema, and the asker gets the
edit; History shows what was edited. Fixtures shared with tests/web/test_browser.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from broker import AskUserQuestionItem, Broker, Editable
from tests.web import test_browser as shared
from tests.web.test_browser import People, ask, card, options

# The browser, the web process and the asking broker, as tests/web/test_browser.py builds them.
web, asker, browser, people, screenshots = shared.web, shared.asker, shared.browser, shared.people, shared.screenshots

pytestmark = [*shared.BROWSER_MARKS, pytest.mark.timeout(50)]

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "recursive": {"type": "boolean"}},
    "required": ["path"],
    "additionalProperties": False,
}


def approval(question: str) -> AskUserQuestionItem:
    return AskUserQuestionItem(
        id="call-1",
        question=question,
        options=options("Approve", "Deny"),
        editable=Editable(arguments={"path": "build/", "recursive": True}, approve="Approve", schema=SCHEMA),
    )


async def test_edit_and_approve_reaches_the_asker_and_history(people: People, asker: Broker, screenshots: Path) -> None:
    page = await people.page()
    asked = ask(asker, approval("Allow delete: `build/`?"))
    request = card(page, "Allow delete: `build/`?")
    await expect(request).to_be_visible()
    await request.get_by_role("button", name="Edit arguments…").click()
    area = request.locator("textarea.edit-args")
    await expect(area).to_be_visible()
    await expect(request.get_by_role("radio", name="Approve")).to_be_checked()  # an edit approves

    await area.fill("{not json")
    await expect(request.locator(".edit-error")).to_contain_text("not JSON")
    await request.get_by_role("button", name="Send answer").click()
    await expect(request.locator(".notice")).to_contain_text("not JSON")  # nothing sent
    await area.fill('{"path": 3}')
    await expect(request.locator(".edit-error")).to_contain_text("“path” must be string")  # checked in the page

    await area.fill('{"path": "build/cache", "recursive": false}')
    await expect(request.locator(".edit-error")).to_be_hidden()
    await page.screenshot(path=screenshots / "20-edit-before-approve.png", full_page=True)
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    answer = await asked
    assert answer.answers[0].selected == ("Approve",)
    assert answer.answers[0].edited == {"path": "build/cache", "recursive": False}

    await page.get_by_role("button", name="History").click()
    entry = page.locator("#history li.history-item", has_text="Allow delete: `build/`?").first
    await expect(entry).to_contain_text('edited: {"path":"build/cache","recursive":false}')


async def test_the_server_checks_the_edit_against_the_schema_too(people: People, asker: Broker) -> None:
    """The page checks only required fields and top-level types; the server applies the whole schema."""
    page = await people.page()
    asked = ask(asker, approval("Allow delete: `dist/`?"))
    request = card(page, "Allow delete: `dist/`?")
    await request.get_by_role("button", name="Edit arguments…").click()
    await request.locator("textarea.edit-args").fill('{"path": "dist/", "force": true}')  # additionalProperties
    await request.get_by_role("button", name="Send answer").click()
    await expect(request.locator(".notice")).to_contain_text("do not fit the tool's schema")
    assert not asked.done()  # still pending: fix it and send again
    await request.get_by_role("button", name="Undo the edit").click()
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    answer = await asked
    assert answer.answers[0].selected == ("Approve",) and answer.answers[0].edited is None  # unchanged: no edit


async def test_an_edit_with_deny_is_refused_in_the_page(people: People, asker: Broker) -> None:
    page = await people.page()
    asked = ask(asker, approval("Allow delete: `tmp/`?"))
    request = card(page, "Allow delete: `tmp/`?")
    await request.get_by_role("button", name="Edit arguments…").click()
    await request.locator("textarea.edit-args").fill('{"path": "tmp/old"}')
    await request.get_by_text("Deny", exact=True).click()
    await request.get_by_role("button", name="Send answer").click()
    await expect(request.locator(".notice")).to_contain_text("Edited arguments go with “Approve”")
    await request.get_by_role("button", name="Undo the edit").click()
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    assert (await asked).answers[0].selected == ("Deny",)
