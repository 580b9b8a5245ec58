"""What a face shows is what is approved, and asker text cannot steer it: the answer page in headless Chromium.

Fixtures shared with tests/web/test_browser.py."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from broker import AskUserQuestionItem, AskUserQuestionOption, Broker, Editable
from tests.web import test_browser as shared
from tests.web.test_browser import People, ask, card, options

web, asker, browser, people, screenshots = shared.web, shared.asker, shared.browser, shared.people, shared.screenshots

pytestmark = [*shared.BROWSER_MARKS, pytest.mark.timeout(50)]


async def test_steering_characters_show_as_escapes_and_the_label_still_answers(people: People, asker: Broker) -> None:
    page = await people.page()
    label = "yes\u202eon"
    item = AskUserQuestionItem(
        id="q1",
        question="Steer \x1b[2J\x1bM\u202e?",
        header="H\x1bE",
        detail="the **detail** \x1b]8;;https://evil\x07 \u2066x\u2069",
        options=(AskUserQuestionOption(label=label, description="d\x1b[31m"), AskUserQuestionOption(label="no")),
    )
    async with asker.agent("agent\u202e1") as agent:
        asked = ask(agent, item)
        request = card(page, "Steer")
        await expect(request).to_be_visible()
        await expect(request.locator(".question-text")).to_contain_text("Steer \\x1b[2J\\x1bM\\u202e?")
        await expect(request.locator(".header-chip")).to_have_text("H\\x1bE")
        await expect(request.locator(".detail")).to_contain_text("\\x1b]8;;https://evil\\x07 \\u2066x\\u2069")
        await expect(request.locator(".choice").first).to_contain_text("yes\\u202eon")
        await expect(request.locator(".desc").first).to_have_text("d\\x1b[31m")
        await expect(request.locator(".agent")).to_contain_text("agent\\u202e1")
        shown = await request.inner_text()
        assert not any(ch in shown for ch in "\x1b\u202e\u2066\u2069")
        await request.locator("input.option").first.check()
        await request.get_by_role("button", name="Send answer").click()
        await expect(request).to_have_count(0)
        assert (await asked).answers[0].selected == (label,)  # shown escaped, answered as the asker wrote it
    await page.get_by_role("button", name="History").click()
    entry = page.locator("#history li.history-item", has_text="Steer").first
    await expect(entry).to_contain_text("Steer \\x1b[2J\\x1bM\\u202e?")
    assert "\u202e" not in await entry.inner_text()


def _approval(question: str, arguments: dict[str, object]) -> AskUserQuestionItem:
    return AskUserQuestionItem(
        id="call-1",
        question=question,
        options=options("Approve", "Deny"),
        editable=Editable(arguments=arguments, approve="Approve"),
    )


async def test_the_arguments_an_approval_runs_are_shown_from_the_top_without_asking(
    people: People, asker: Broker
) -> None:
    """Issue: the card hid the arguments until "Edit arguments…", and the editor opened scrolled to the end."""
    page = await people.page()
    arguments: dict[str, object] = {
        "command": "rm -rf build/\u202e",
        "lines": [f"line {n} " + "x" * 60 for n in range(200)],
    }
    asked = ask(asker, _approval("Run the long call?", arguments))
    request = card(page, "Run the long call?")
    shown = request.locator("pre.edit-shown")
    await expect(shown).to_be_visible()  # no click needed
    await expect(shown).to_contain_text('"command": "rm -rf build/\\u202e"')
    await expect(shown).to_contain_text("line 199")  # whole, in a box that scrolls
    assert await shown.evaluate("node => node.scrollTop") == 0
    await request.get_by_role("button", name="Edit arguments…").click()
    area = request.locator("textarea.edit-args")
    await expect(area).to_be_visible()
    assert await area.evaluate("node => [node.scrollTop, node.selectionStart, node.selectionEnd]") == [0, 0, 0]
    await request.get_by_role("button", name="Send answer").click()
    await expect(request).to_have_count(0)
    answer = await asked
    assert answer.answers[0].selected == ("Approve",) and answer.answers[0].edited is None  # the escapes parse back
