"""The Block Kit a card becomes, and the Slack settings file: pure functions, no Slack, no Redis."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from broker import AskUserQuestionItem, AskUserQuestionRequest, PendingRequest
from tests.helpers import question
from workers.answering.slack.blocks import card_blocks, escape, plan_chunks
from workers.answering.slack.config import SlackConfigError, load_slack_config


class _Pending:
    """What ``card_blocks`` reads of a ``PendingRequest``."""

    def __init__(self, request: AskUserQuestionRequest) -> None:
        self.request, self.request_id, self.agent_id, self.priority = request, "r1", request.agent, "normal"


def blocks_of(request: AskUserQuestionRequest, view: dict[str, Any] | None = None) -> str:
    pending: PendingRequest = _Pending(request)  # type: ignore[assignment]
    return json.dumps(card_blocks(pending, view or {"priority": "normal"}, "ns"))


def test_asker_text_cannot_mention_or_link() -> None:
    assert escape("<!channel> <@U1> <https://evil|bank> & co") == (
        "&lt;!channel&gt; &lt;@U1&gt; &lt;https://evil|bank&gt; &amp; co"
    )
    text = blocks_of(AskUserQuestionRequest(questions=(question("q1", "a", header="<!here>", detail="<@U2>"),)))
    assert "<!here>" not in text and "<@U2>" not in text


@pytest.mark.parametrize(
    ("request_", "present", "absent"),
    [
        pytest.param(
            AskUserQuestionRequest(questions=(question("q1", "yes", "no"),)),
            ["qb_pick_0", "qb_pick_1", "qb_other", "qb_dismiss"],
            ["qb_submit", "checkboxes"],
            id="single-select-buttons",
        ),
        pytest.param(
            AskUserQuestionRequest(questions=(question("q1", "a", "b", multi=True),)),
            ["checkboxes", "qb_submit", "qb_other"],
            ["qb_pick_0"],
            id="multi-select-checkboxes",
        ),
        pytest.param(
            AskUserQuestionRequest(questions=(question("q1", "a", "b"), question("q2", "c", "d"))),
            ["radio_buttons", "qb_submit"],
            ["qb_pick_0"],
            id="batch-radio-buttons",
        ),
        pytest.param(
            AskUserQuestionRequest(questions=(question("q1", *(f"o{i}" for i in range(11))),)),
            [],
            ["qb_pick_0", "qb_submit", "qb_other"],
            id="more-choices-than-slack-shows",
        ),
    ],
)
def test_each_kind_of_question_gets_its_controls(request_, present, absent) -> None:
    text = blocks_of(request_)
    for needle in present:
        assert needle in text
    for needle in absent:
        assert needle not in text


def test_the_settings_file_routes_channels_and_maps_users(tmp_path: Path) -> None:
    config, users = tmp_path / "slack.toml", tmp_path / "users.toml"
    config.write_text('channel = "CALL"\n[[route]]\nchannel = "CPROD"\nnamespace = ["prod-*"]\npriority = "urgent"\n')
    users.write_text('[slack]\nalice = "UALICE"\nbob = "Bob@Example.com"\n')
    loaded = load_slack_config(config, users, bot_token="xoxb-secret", signing_secret="s3cret")
    assert loaded.channel_for("prod-eu", "urgent", None) == "CPROD"
    assert loaded.channel_for("prod-eu", "normal", None) == "CALL"
    assert loaded.user_of("UALICE") == "alice" and loaded.user_of("UBOB", "bob@example.com") == "bob"
    assert loaded.user_of("UMALLORY", "mallory@example.com") is None
    assert "xoxb-secret" not in repr(loaded) and "s3cret" not in repr(loaded)
    with pytest.raises(SlackConfigError, match="QBROKER_SLACK_BOT_TOKEN"):
        load_slack_config(config, users, bot_token="", signing_secret="s3cret")
    config.write_text('channel = "CALL"\nchanel = "typo"\n')
    with pytest.raises(SlackConfigError, match="unknown keys"):
        load_slack_config(config, users, bot_token="x", signing_secret="y")


def test_the_docs_show_the_block_kit_a_card_becomes() -> None:
    """docs/slack.md's sample is what card_blocks makes of its request (the docs cannot drift)."""
    from broker import AskUserQuestionItem, AskUserQuestionOption

    item = AskUserQuestionItem(
        id="db",
        header="Migration",
        question="Run the migration on prod now?",
        detail="It locks `orders` for about 40 s.",
        options=(AskUserQuestionOption(label="Run it"), AskUserQuestionOption(label="Tonight")),
    )
    pending = _Pending(AskUserQuestionRequest(questions=(item,), agent="migrator-3", priority="urgent"))
    pending.request_id, pending.priority = "a1b2c3", "urgent"
    quorum = {"needed": 2, "groups": ["sre"], "approvedBy": ["alice"], "declinedBy": [], "mayStill": ["bob", "dave"]}
    view = {"priority": "urgent", "askers": [{"agent": "migrator-3"}], "deadlineMs": 1767225600000, "quorum": quorum}
    made = card_blocks(pending, view, "prod", "https://qbroker.example.com/")  # type: ignore[arg-type]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "slack.md").read_text()
    shown = re.search(r"<!-- block-kit-sample -->\n```json\n(.*?)\n```", doc, re.S)
    assert shown is not None and json.loads(shown.group(1)) == made


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def _made(request: AskUserQuestionRequest, view: dict[str, Any] | None = None) -> list[Any]:
    pending: PendingRequest = _Pending(request)  # type: ignore[assignment]
    return card_blocks(pending, view or {"priority": "normal"}, "ns", "https://qb.example/")


def _button(blocks: list[Any], text: str) -> dict[str, Any]:
    return next(e for b in blocks if b["type"] == "actions" for e in b["elements"] if e["text"]["text"] == text)


def test_asker_text_cannot_steer_the_card_or_its_modals() -> None:
    """Control characters, escape sequences and bidi overrides show as escapes (workers.inert), never raw."""
    from broker import AskUserQuestionOption
    from workers.answering.slack.blocks import other_modal
    from workers.inert import steers

    evil = "\x1b[2J\x1bM\u202e\u2066"
    item = AskUserQuestionItem(
        id="q1",
        question="Steer " + evil,
        header="H" + evil,
        detail="detail " + evil,
        options=(AskUserQuestionOption(label="yes" + evil), AskUserQuestionOption(label="no")),
    )
    request = AskUserQuestionRequest(questions=(item,))
    blocks = _made(request, {"priority": "normal", "askers": [{"agent": "agent" + evil}]})
    pending: PendingRequest = _Pending(request)  # type: ignore[assignment]
    texts = _strings(blocks) + _strings(other_modal(pending, "{}"))
    assert not [text for text in texts if steers(text)]
    shown = "\n".join(texts)
    for field in ("Steer ", "H", "detail ", "yes", "agent"):
        assert field + "\\x1b[2J\\x1bM\\u202e\\u2066" in shown


def _approval(arguments: dict[str, Any]) -> AskUserQuestionRequest:
    from broker import Editable

    item = question("call", "Approve", "Deny")
    item = AskUserQuestionItem(
        id=item.id,
        question=item.question,
        options=item.options,
        editable=Editable(arguments=arguments, approve="Approve"),
    )
    return AskUserQuestionRequest(questions=(item,))


def test_the_arguments_an_approval_runs_are_in_the_card() -> None:
    blocks = _made(_approval({"cmd": "rm -rf build/\u202e"}))
    shown = "\n".join(_strings(blocks))
    assert '"cmd": "rm -rf build/\\u202e"' in shown
    assert "confirm" not in _button(blocks, "Approve")  # all of it shown: one click approves


def test_arguments_the_card_cannot_hold_say_how_much_is_not_shown_and_approving_takes_a_confirmation() -> None:
    request = _approval({"a": "top", "z": "x" * 5000 + "END"})
    blocks = _made(request)
    shown = "\n".join(_strings(blocks))
    assert '"a": "top"' in shown and "END" not in shown
    unseen = re.search(r"(\d+) characters of what this approves are not shown here", shown)
    assert unseen is not None and int(unseen.group(1)) > 2000
    assert "whole in this message's thread" in shown and "https://qb.example/" in json.dumps(blocks)
    confirm = _button(blocks, "Approve")["confirm"]
    assert unseen.group(1) in confirm["text"]["text"] and confirm["confirm"]["text"]
    assert "confirm" not in _button(blocks, "Deny")  # declining the unseen needs no second step
    pending: PendingRequest = _Pending(request)  # type: ignore[assignment]
    assert "END" in "".join(plan_chunks(pending))  # the whole arguments, in the thread


def test_approving_a_plan_the_card_cuts_takes_a_confirmation() -> None:
    from broker import PlanReviewIntent

    item = question(
        "plan", "Approve", "Refuse", detail="# Plan\n" + "step\n" * 1000, intent=PlanReviewIntent(approve="Approve")
    )
    blocks = _made(AskUserQuestionRequest(questions=(item,)))
    assert "characters of what this approves are not shown here" in "\n".join(_strings(blocks))
    approve = next(e for b in blocks if b["type"] == "actions" for e in b["elements"] if e["action_id"] == "qb_approve")
    assert "confirm" in approve
    short = _made(AskUserQuestionRequest(questions=(question("plan", "Approve", "Refuse", detail="# Plan\n1. do it",
                                                              intent=PlanReviewIntent(approve="Approve")),)))  # fmt: skip
    approve = next(e for b in short if b["type"] == "actions" for e in b["elements"] if e["action_id"] == "qb_approve")
    assert "confirm" not in approve


def test_an_attached_whole_is_named_on_the_card_and_allowing_it_takes_a_confirmation() -> None:
    """The Claude Code hook attaches a long tool input whole (the card shows its head): Slack cannot hold it,
    so the card says it is attached and where to read it, and Allow asks before approving it unseen."""
    from broker import Attachment

    item = question("permission", "Allow", "Deny", detail="echo start ... (the head)")
    item = AskUserQuestionItem(
        id=item.id, question=item.question, options=item.options, detail=item.detail,
        attachment=Attachment(sha256="a" * 64, size=30_123),
    )  # fmt: skip
    blocks = _made(AskUserQuestionRequest(questions=(item,)))
    shown = "\n".join(_strings(blocks))
    assert "30,123 bytes" in shown and "attached" in shown and "https://qb.example/" in json.dumps(blocks), shown
    assert "confirm" in _button(blocks, "Allow") and "confirm" in _button(blocks, "Deny")  # a plain question: any pick
