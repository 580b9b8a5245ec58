"""A late Slack click is routed like the page's (docs/approvals.md, "History is routed too"): told who settled a
card only if the person clicking could see it. A real web process, a real redis-server, the fake Slack of
``test_face.py`` (its fixtures and helpers)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker import AskUserQuestionRequest
from tests.helpers import question
from tests.slack import test_face
from tests.slack.fake_slack import FakeSlack, block_actions
from tests.slack.test_face import asking, card, ephemeral, post, updated
from tests.web.conftest import WebProcess

slack, start_slack_web = test_face.slack, test_face.start_slack_web  # its fixtures, for the test here

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

POLICY = '[[policy]]\nname = "billing"\nmatch = { header = "Billing" }\nroute = "sre"\n'


async def test_a_late_slack_click_on_a_card_routed_elsewhere_is_not_told_who_settled_it(
    start_slack_web: Callable[..., Awaitable[WebProcess]], slack: FakeSlack, make_broker: Any, tmp_path: Path
) -> None:
    """Routed to sre (alice); bob is mapped (by e-mail: the face resolves him to the person) but not in sre. After
    alice answers, bob's late click, on the server that showed the card and on one that never did (the audit's
    route), is told only that it was not taken; alice's is told who was first."""
    (tmp_path / "policy.toml").write_text(POLICY)
    groups = '[groups]\nsre = ["alice"]\n'
    holder = await start_slack_web(groups, "--policy-file", str(tmp_path / "policy.toml"))
    standby = await start_slack_web(groups, "--policy-file", str(tmp_path / "policy.toml"), name="web-2")
    asker = await make_broker()
    asked = asking(asker, AskUserQuestionRequest(questions=(question("q1", "Pay", "Hold", header="Billing"),)))
    posted = await card(slack)
    await post(holder, block_actions(posted, "qb_pick_0", user="UALICE"))
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("Pay",)
    await updated(slack, "Answered by alice in Slack")

    for web in (holder, standby):
        slack.calls.clear()
        await post(web, block_actions(posted, "qb_pick_1", user="UBOB"))
        told = await ephemeral(slack, "UBOB", "your click was not taken")
        assert told["text"] == "Already settled: your click was not taken.", (web.name, told)
        await post(web, block_actions(posted, "qb_pick_1", user="UALICE"))  # a member is told who was first
        await ephemeral(slack, "UALICE", "Already answered by alice")
