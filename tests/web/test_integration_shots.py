"""What the human sees for each framework: the card each integration puts on the answer page, built by
the integration's own code, shown in headless Chromium and photographed.

``QBROKER_DOC_IMAGES=docs/img`` writes the shots that docs/integrations.md shows (regenerate them so);
otherwise they go to the test's screenshot directory. Pixels are not compared (fonts and "asked 2 s ago"
differ between machines); each card's content is checked instead. Fixtures shared with
tests/web/test_browser.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from playwright.async_api import Page, expect

from broker import Broker
from tests.web import test_browser as shared
from tests.web.test_browser import People, card

web, asker, browser, people, screenshots = shared.web, shared.asker, shared.browser, shared.people, shared.screenshots

pytestmark = [*shared.BROWSER_MARKS, pytest.mark.timeout(50)]


def _out(screenshots: Path) -> Path:
    where = os.environ.get("QBROKER_DOC_IMAGES")
    return Path(where) if where else screenshots


async def _shoot(page: Page, asking: Awaitable[Any], question: str, name: str, where: Path, *shown: str) -> None:
    task = asyncio.ensure_future(asking)
    try:
        found = card(page, question)
        await expect(found).to_be_visible(timeout=15_000)
        for text in shown:
            await expect(found).to_contain_text(text)
        await found.screenshot(path=str(where / f"{name}.png"))
    finally:
        task.cancel()  # withdrawn (a keyed ask only detached): each shot is of its own card anyway
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def test_claude_code(people: People, asker: Broker, screenshots: Path) -> None:
    from workers.asking.claude_hook.questions import HookPayload, asking_for

    payload = msgspec.convert(
        {
            "session_id": "abc123", "cwd": "/home/alice/shop", "permission_mode": "default",
            "hook_event_name": "PermissionRequest", "tool_name": "Bash",
            "tool_input": {"command": "npm test -- --watch=false", "description": "Run the test suite"},
            "permission_suggestions": [{"type": "addRules", "rules": [{"toolName": "Bash", "ruleContent": "npm test:*"}],
                                        "behavior": "allow", "destination": "localSettings"}],
        },
        HookPayload,
    )  # fmt: skip
    asking = asking_for(payload, remember=False, destination="session")
    assert asking is not None
    page = await people.page()
    question = "Allow Bash: `npm test -- --watch=false`?"
    async with asker.agent("claude-code-abc123") as agent:
        await _shoot(page, agent.ask(asking.request, timeout=40), question, "claude-code", _out(screenshots),
                     "Allow and remember", "/home/alice/shop")  # fmt: skip


async def test_langgraph_human_in_the_loop(people: People, asker: Broker, screenshots: Path) -> None:
    from broker_adapters.langgraph import resume_value

    value = {
        "action_requests": [
            {"name": "send_email", "args": {"to": "ops@example.org", "subject": "Deploy done"},
             "description": "Tool execution requires approval"},
        ],
        "review_configs": [{"action_name": "send_email", "allowed_decisions": ["approve", "edit", "reject"]}],
    }  # fmt: skip
    page = await people.page()
    async with asker.agent("support-graph") as agent:
        await _shoot(page, resume_value(value, agent, timeout=40), "send_email", "langgraph", _out(screenshots),
                     "Approve", "Reject")  # fmt: skip


async def test_pydantic_ai(people: People, asker: Broker, screenshots: Path) -> None:
    from pydantic_ai import DeferredToolRequests
    from pydantic_ai.messages import ToolCallPart

    from broker_adapters.pydantic_ai import decide

    part = ToolCallPart(tool_name="refund", args={"order": "A-1042", "amount": 120}, tool_call_id="call-1")
    requests = DeferredToolRequests(approvals=[part], metadata={"call-1": {"reason": "over the 100 EUR limit"}})
    page = await people.page()
    async with asker.agent("refund-agent") as agent:
        await _shoot(page, decide(requests, agent, timeout=40), "refund", "pydantic-ai", _out(screenshots),
                     "over the 100 EUR limit", "Approve")  # fmt: skip


async def test_openai_agents(people: People, asker: Broker, screenshots: Path) -> None:
    from agents import Agent, ToolApprovalItem, function_tool
    from openai.types.responses import ResponseFunctionToolCall

    from broker_adapters import openai_agents
    from broker_adapters._approvals import ask_approvals

    @function_tool(needs_approval=True)
    def run_migration(name: str) -> str:
        """Run a database migration."""
        return name

    raw = ResponseFunctionToolCall(
        type="function_call", call_id="c1", name="run_migration", arguments='{"name": "orders_add_region"}', id="fc_c1"
    )
    item = ToolApprovalItem(agent=Agent(name="planner", tools=[run_migration]), raw_item=raw)
    call = openai_agents._call(0, item)
    page = await people.page()
    async with asker.agent("planner") as agent:
        await _shoot(page, ask_approvals(agent, [call], timeout=40), "run_migration", "openai-agents",
                     _out(screenshots), "Always approve")  # fmt: skip
