"""Rules for ``qbroker auto``: match a question, answer it by policy.

A rules file is TOML::

    [default]               # for questions no rule matches (default: cancel)
    skip = true

    [[rule]]
    agent = "ci-*"          # glob on the asking agent id ("" matches agentless asks)
    verified = true         # only when a pinned gateway attested that agent id (false: only claimed ones)
    header = "Deploy"       # glob on the header
    question = "(?i)proceed"  # regex, searched in the question text
    intent = "plan-review"  # intent kind, or "none"
    namespace = "staging"   # glob on the namespace
    approve = true          # the action: one of select, approve, custom, skip, cancel, first
    delay = 0.5             # seconds to wait before answering (simulated think time)

Actions: ``select = "label"`` (or a list for multi-select), ``approve = true`` (the
plan-review intent's approve label), ``custom = "text"``, ``skip = true``,
``cancel = "message"`` (the whole batch: the asker gets ASK_CANCELLED), ``first = true``
(the first option). Every question of a batch is matched on its own, first rule wins;
one cancel cancels the batch. Errors name the file and line at fault.

An agent id is what the asker claims unless a pinned gateway attested it (``--gateway-keys-file``);
a rule keyed on ``agent`` that grants something should say ``verified = true``, or any asker
holding a Redis user can claim that id (docs/security.md).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionRequest,
    PlanReviewIntent,
    UnknownIntent,
)

__all__ = ["Decision", "Rule", "Rules", "RulesError", "intent_kind", "load_rules", "parse_rules"]

ActionKind = Literal["select", "approve", "custom", "skip", "cancel", "first"]
_ACTIONS: Final = ("select", "approve", "custom", "skip", "cancel", "first")
_MATCHERS: Final = ("namespace", "agent", "verified", "header", "question", "intent")
_KNOWN: Final = frozenset(_ACTIONS + _MATCHERS + ("delay",))


class RulesError(ValueError):
    """An invalid rules file; the message names the file and line."""


@dataclass(frozen=True, kw_only=True)
class Rule:
    line: int
    action: ActionKind
    value: Any = None
    delay: float = 0.0
    namespace: str | None = None
    agent: str | None = None
    header: str | None = None
    question: re.Pattern[str] | None = None
    intent: str | None = None
    verified: bool | None = None

    def matches(self, namespace: str, agent: str | None, item: AskUserQuestionItem, verified: bool = False) -> bool:
        if self.namespace is not None and not fnmatch.fnmatchcase(namespace, self.namespace):
            return False
        if self.verified is not None and verified != self.verified:
            return False
        if self.agent is not None and not fnmatch.fnmatchcase(agent or "", self.agent):
            return False
        if self.header is not None and not fnmatch.fnmatchcase(item.header or "", self.header):
            return False
        if self.question is not None and not self.question.search(item.question):
            return False
        if self.intent is not None and intent_kind(item) != self.intent:
            return False
        return self.action != "approve" or isinstance(item.intent, PlanReviewIntent)


def intent_kind(item: AskUserQuestionItem) -> str:
    """The question's intent kind, ``"none"`` without one."""
    intent = item.intent
    if intent is None:
        return "none"
    if isinstance(intent, UnknownIntent):
        return intent.kind
    tag = intent.__struct_config__.tag if isinstance(intent, msgspec.Struct) else None
    return str(tag) if tag is not None else type(intent).__name__


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What to do with one request: an answer, or a cancel message; after ``delay`` seconds."""

    answer: AskUserQuestionAnswer | None
    cancel: str | None
    delay: float
    lines: tuple[int, ...]
    """the rule line that decided each question (0: the default)"""


@dataclass(frozen=True)
class Rules:
    rules: tuple[Rule, ...]
    default: Rule

    def decide(self, namespace: str, request: AskUserQuestionRequest, *, verified: bool = False) -> Decision:
        """``verified``: a pinned gateway attested the request's agent id (else it is only claimed)."""
        items: list[AskUserQuestionAnswerItem] = []
        lines: list[int] = []
        delay = 0.0
        for item in request.questions:
            rule = next((r for r in self.rules if r.matches(namespace, request.agent, item, verified)), self.default)
            lines.append(0 if rule is self.default else rule.line)
            delay = max(delay, rule.delay)
            if rule.action == "cancel":
                return Decision(answer=None, cancel=str(rule.value), delay=delay, lines=tuple(lines))
            items.append(_answer(rule, item))
        answer = AskUserQuestionAnswer(answers=tuple(items))
        return Decision(answer=answer, cancel=None, delay=delay, lines=tuple(lines))


def _answer(rule: Rule, item: AskUserQuestionItem) -> AskUserQuestionAnswerItem:
    if rule.action == "select":
        labels = (rule.value,) if isinstance(rule.value, str) else tuple(rule.value)
        return AskUserQuestionAnswerItem(id=item.id, selected=labels)
    if rule.action == "approve":
        assert isinstance(item.intent, PlanReviewIntent)
        return AskUserQuestionAnswerItem(id=item.id, selected=(item.intent.approve,))
    if rule.action == "custom":
        return AskUserQuestionAnswerItem(id=item.id, selected=(), custom=str(rule.value))
    if rule.action == "first" and item.labels:
        return AskUserQuestionAnswerItem(id=item.id, selected=item.labels[:1])
    return AskUserQuestionAnswerItem(id=item.id, selected=())  # skip (or `first` without options)


def _table_lines(text: str) -> tuple[int, list[int]]:
    """Line numbers of the ``[default]`` header and of each ``[[rule]]`` header."""
    default_line = 0
    rule_lines: list[int] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if re.match(r"^\[\[\s*rule\s*\]\]", line):
            rule_lines.append(number)
        elif re.match(r"^\[\s*default\s*\]", line):
            default_line = number
    return default_line, rule_lines


def _key_line(text: str, header: int, key: str) -> int:
    """The line of ``key = ...`` in the table whose header is on line ``header`` (0: top level)."""
    lines = text.splitlines()
    for index in range(header, len(lines)):
        line = lines[index].strip()
        if line.startswith("["):
            break
        if re.match(rf'^(?:{re.escape(key)}|"{re.escape(key)}")\s*=', line):
            return index + 1
    if header == 0:  # a misspelt table: find its header
        for index, raw in enumerate(lines):
            if re.match(rf"^\[+\s*{re.escape(key)}\s*\]", raw.strip()):
                return index + 1
    return max(header, 1)


def _build(table: Any, line: int, text: str, where: str, *, is_default: bool) -> Rule:
    def fail(message: str, key: str | None = None) -> RulesError:
        at = _key_line(text, line, key) if key else line
        return RulesError(f"{where}:{at}: {message}")

    if not isinstance(table, dict):
        raise fail("a rule must be a table")
    unknown = sorted(set(table) - _KNOWN)
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})", unknown[0])
    actions = [key for key in _ACTIONS if key in table]
    if len(actions) != 1:
        raise fail(f"give exactly one action of {', '.join(_ACTIONS)} (found {len(actions)})")
    action: ActionKind = actions[0]  # type: ignore[assignment]
    value = table[action]
    if action == "select":
        ok = isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value))
        if not ok:
            raise fail("select takes a label or a non-empty list of labels", action)
    elif action == "custom":
        if not isinstance(value, str) or not value.strip():
            raise fail("custom takes a non-blank text", action)
    elif action == "cancel":
        if value is True:
            value = "cancelled by rule"
        if not isinstance(value, str) or not value.strip():
            raise fail("cancel takes a message (or true)", action)
    elif value is not True:
        raise fail(f"{action} takes true", action)
    if is_default:
        matchers = [key for key in _MATCHERS if key in table]
        if matchers:
            raise fail("the default matches everything: it takes no matcher", matchers[0])
        if action == "approve":
            raise fail("the default cannot approve (not every question is a plan review)", action)
    delay = table.get("delay", 0.0)
    if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
        raise fail("delay takes a number of seconds >= 0", "delay")
    fields: dict[str, Any] = {}
    for key in ("namespace", "agent", "header", "intent"):
        if key in table:
            if not isinstance(table[key], str):
                raise fail(f"{key} takes a string", key)
            fields[key] = table[key]
    if "verified" in table:
        if not isinstance(table["verified"], bool):
            raise fail("verified takes true or false", "verified")
        fields["verified"] = table["verified"]
    if "question" in table:
        if not isinstance(table["question"], str):
            raise fail("question takes a regular expression string", "question")
        try:
            fields["question"] = re.compile(table["question"])
        except re.error as error:
            raise fail(f"question is not a valid regular expression: {error}", "question") from None
    return Rule(line=line, action=action, value=value, delay=float(delay), **fields)


def parse_rules(text: str, where: str = "<rules>") -> Rules:
    """Parse and check a rules document; raises ``RulesError`` naming the line at fault."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        match = re.search(r"line (\d+)", str(error))
        raise RulesError(f"{where}:{match.group(1) if match else '?'}: not valid TOML: {error}") from None
    default_line, rule_lines = _table_lines(text)
    unknown = sorted(set(data) - {"rule", "default"})
    if unknown:
        at = _key_line(text, 0, unknown[0])
        raise RulesError(f"{where}:{at}: unknown key {unknown[0]!r} (use [[rule]] tables and one [default])")
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise RulesError(f"{where}:1: `rule` must be an array of tables: write [[rule]]")
    if len(rule_lines) != len(tables):  # inline-table arrays: fall back to the first line
        rule_lines = [1] * len(tables)
    rules = tuple(
        _build(table, line, text, where, is_default=False) for table, line in zip(tables, rule_lines, strict=True)
    )
    if "default" in data:
        default = _build(data["default"], default_line or 1, text, where, is_default=True)
    else:
        default = Rule(line=0, action="cancel", value="no rule matched this question")
    return Rules(rules, default)


def load_rules(path: str | Path) -> Rules:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise RulesError(f"{path}: cannot read: {error.strerror}") from None
    return parse_rules(text, str(path))
