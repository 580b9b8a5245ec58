from __future__ import annotations

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


def test_the_example_rules_answer_the_readme_question():
    """Issue 16: the shipped example's default cancelled everything, so README's `qbroker ask` exited 8."""
    from pathlib import Path

    from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest

    path = Path(__file__).resolve().parents[2] / "deploy" / "rules.example.toml"
    rules = parse_rules(path.read_text(), str(path))
    options = (AskUserQuestionOption(label="yes"), AskUserQuestionOption(label="no"))
    item = AskUserQuestionItem(id="q1", question="Deploy now?", options=options)
    decision = rules.decide("default", AskUserQuestionRequest(questions=(item,)))
    assert decision.cancel is None and decision.answer is not None
    assert decision.answer.answers[0].selected == ("yes",)
    from_ci = rules.decide("default", AskUserQuestionRequest(questions=(item,), agent="ci-42"))
    assert from_ci.cancel is not None  # destructive steps from CI agents still need a human
