from __future__ import annotations

import re
from pathlib import Path

import pytest
from msgspec.structs import replace

from broker import AskUserQuestionRequest, PlanReviewIntent, UnknownIntent
from tests.helpers import answer, question
from workers.answering.auto.rules import RulesError, intent_kind, parse_rules

RULES = """\
[default]
skip = true

[[rule]]
agent = "ci-*"
question = "(?i)deploy"
cancel = "no deploys from CI"

[[rule]]
intent = "plan-review"
approve = true
delay = 0.25

[[rule]]
header = "Colour"
select = ["red", "blue"]

[[rule]]
question = "name"
custom = "Ada"

[[rule]]
namespace = "bench*"
first = true
"""


def _request(*items, agent=None):
    return AskUserQuestionRequest(questions=tuple(items), agent=agent)


def test_each_question_takes_the_first_matching_rule():
    rules = parse_rules(RULES)
    plan = question("plan", "Ship", "Stop", detail="# plan", intent=PlanReviewIntent(approve="Ship"))
    colour = question("c", "red", "green", "blue", multi=True, header="Colour")
    name = replace(question("n"), question="your name?")
    other = question("o", "x", "y")
    decision = rules.decide("prod", _request(plan, colour, name, other))
    assert decision.cancel is None and decision.delay == 0.25
    assert decision.answer == answer(
        ("plan", ("Ship",), None), ("c", ("red", "blue"), None), ("n", (), "Ada"), ("o", (), None)
    )
    assert decision.lines == (9, 14, 18, 0)
    assert rules.decide("bench-1", _request(other)).answer == answer(("o", ("x",), None))


def test_one_cancel_cancels_the_batch_and_agent_globs_match():
    rules = parse_rules(RULES)
    deploy = replace(question("d", "yes", "no"), question="Deploy now?")
    assert rules.decide("prod", _request(deploy, agent="ci-7")).cancel == "no deploys from CI"
    assert rules.decide("prod", _request(deploy, agent="dev")).cancel is None
    assert rules.decide("prod", _request(deploy)).cancel is None


def test_approve_only_matches_plan_reviews_and_the_default_is_cancel():
    rules = parse_rules("[[rule]]\napprove = true\n")
    unknown = question("u", "a", detail="d", intent=UnknownIntent("future", {"kind": "future"}))
    decision = rules.decide("ns", _request(unknown))
    assert decision.cancel == "no rule matched this question" and decision.lines == (0,)
    assert intent_kind(unknown) == "future"


TYPO = "\n[[rule]]\nskip = true\n\n[[rule]]\nagnet = 'x'\nskip = true\n"
DEFAULT_MATCHER = "[[rule]]\nskip = true\n[default]\nagent = 'x'\nskip = true\n"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        pytest.param("[[rule]]\nselect = \n", 2, "not valid TOML", id="toml-syntax"),
        pytest.param("\n[[rule]]\nskip = 1 == 1\n", 3, "not valid TOML", id="toml-value"),
        pytest.param(TYPO, 6, "unknown key 'agnet'", id="unknown-key"),
        pytest.param("[[rule]]\nagent = 'x'\n", 1, "exactly one action", id="no-action"),
        pytest.param("[[rule]]\nskip = true\ncancel = 'x'\n", 1, "exactly one action", id="two-actions"),
        pytest.param("[[rule]]\n\nquestion = '('\nskip = true\n", 3, "regular expression", id="bad-regex"),
        pytest.param("[[rule]]\nskip = true\ndelay = -1\n", 3, "delay", id="negative-delay"),
        pytest.param("[[rule]]\nselect = []\n", 2, "select", id="empty-select"),
        pytest.param("[[rule]]\ncustom = '  '\n", 2, "custom", id="blank-custom"),
        pytest.param("[[rule]]\nskip = false\n", 2, "skip takes true", id="skip-false"),
        pytest.param(DEFAULT_MATCHER, 4, "no matcher", id="default-matcher"),
        pytest.param("[default]\napprove = true\n", 2, "cannot approve", id="default-approve"),
        pytest.param("[[rule]]\nskip = true\n\n[rules]\nskip = true\n", 4, "unknown key 'rules'", id="misspelt-table"),
    ],
)  # fmt: skip
def test_invalid_rules_name_the_line(text, line, message):
    with pytest.raises(RulesError) as error:
        parse_rules(text, "rules.toml")
    assert str(error.value).startswith(f"rules.toml:{line}: ")
    assert message in str(error.value)


ROOT = Path(__file__).resolve().parents[2]
GRANTS = ("select", "approve", "custom", "first")
"""the actions that answer a question; ``cancel`` refuses and ``skip`` answers nothing"""


def _rules_blocks(path: Path) -> list[tuple[str, str]]:
    """The rules a shipped file holds: the file itself, or each ```toml block of a markdown file."""
    text = path.read_text()
    if path.suffix == ".toml":
        return [(str(path.relative_to(ROOT)), text)]
    if path.suffix == ".md":
        blocks = re.findall(r"^```toml\n(.*?)^```", text, re.M | re.S)
        return [(f"{path.relative_to(ROOT)} block {n}", b) for n, b in enumerate(blocks) if "[[policy]]" not in b]
    pytest.fail(f"{path.relative_to(ROOT)} holds rules this test cannot read: teach it to")


def shipped_rules() -> list[tuple[str, str]]:
    """Every rules file and docs snippet of rules shipped: deploy/, examples/, docs/, the README."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += [p for d in ("deploy", "examples") for p in sorted((ROOT / d).rglob("*")) if p.is_file()]
    found = []
    for path in files:
        if "node_modules" in path.parts or path.suffix in (".pyc",):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if "[[rule]]" in text or re.search(r"^\[default\]", text, re.M):
            found += [(name, b) for name, b in _rules_blocks(path) if "[[rule]]" in b or "[default]" in b]
    return found


def test_every_shipped_rule_that_answers_requires_a_verified_agent():
    """Row 8: `deploy/rules.example.toml` (mounted by docker-compose) refused by claimed agent id and answered
    the rest with the first option, so anyone claiming another id got a deploy approved. A claimed id may be
    refused; only an attested one (`verified = true`) may be answered, and no default answers."""
    shipped = shipped_rules()
    names = {name for name, _ in shipped}
    assert "deploy/rules.example.toml" in names and any(n.startswith("docs/cli.md") for n in names)
    for name, text in shipped:
        rules = parse_rules(text, name)
        for rule in rules.rules:
            if rule.action in GRANTS:
                assert rule.verified is True, f"{name}: the rule at line {rule.line} answers a claimed agent id"
        assert rules.default.action not in GRANTS, f"{name}: the default answers ({rules.default.action})"


def test_the_example_rules_answer_attested_agents_only():
    """Issue 16 made the example's default answer README's `qbroker ask` (the first option); that approved a
    deploy for anyone claiming an id. Now a claimed ask is cancelled with a reason that says why."""
    from broker import AskUserQuestionItem, AskUserQuestionOption, PlanReviewIntent

    rules = parse_rules((ROOT / "deploy" / "rules.example.toml").read_text(), "rules.example.toml")
    options = (AskUserQuestionOption(label="yes"), AskUserQuestionOption(label="no"))
    item = AskUserQuestionItem(id="q1", question="Deploy now?", options=options)
    for agent, verified in ((None, False), ("builder", False), ("builder", True)):
        decision = rules.decide("default", AskUserQuestionRequest(questions=(item,), agent=agent), verified=verified)
        assert decision.answer is None and decision.cancel and "human" in decision.cancel
    review = replace(
        item,
        question="Plan ok?",
        detail="the plan",
        options=(AskUserQuestionOption(label="Approve"), AskUserQuestionOption(label="Reject")),
        intent=PlanReviewIntent(approve="Approve"),
    )
    claimed = rules.decide("default", AskUserQuestionRequest(questions=(review,), agent="builder"))
    assert claimed.cancel is not None
    attested = rules.decide("default", AskUserQuestionRequest(questions=(review,), agent="builder"), verified=True)
    assert attested.answer is not None and attested.answer.answers[0].selected == ("Approve",)
    from_ci = rules.decide("default", AskUserQuestionRequest(questions=(item,), agent="ci-42"), verified=True)
    assert from_ci.cancel is not None and "human" in from_ci.cancel  # destructive steps from CI need a human
