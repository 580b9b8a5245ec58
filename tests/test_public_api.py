"""Every public module declares what it exports, and exports only what it has (after anyio's)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import broker

_PUBLIC = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(broker.__path__, "broker.")
    if not any(part.startswith("_") for part in name.split(".")[1:])
)


@pytest.mark.parametrize("name", ["broker", *_PUBLIC])
def test_a_public_module_declares_its_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list | tuple), f"{name} has no __all__"
    missing = [attribute for attribute in exported if not hasattr(module, attribute)]
    assert missing == [], f"{name}.__all__ names what it does not have"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"


def test_the_package_exports_the_whole_contract() -> None:
    """The seeds' types, the error classes and the broker's entry points come from `broker`."""
    for name in ("Broker", "Agent", "Provider", "PendingRequest", "UserQuestionError", "HarnessError",
                 "AskUserQuestionRequest", "AskUserQuestionAnswer", "PlanReviewIntent", "UnknownIntent"):  # fmt: skip
        assert name in broker.__all__


def test_who_answered_is_public_and_off_the_wire() -> None:
    """``AskUserQuestionAnswer.answered_by`` (tests/test_answered_by.py): read-only, not a field, so the
    answer's JSON, its schema and its equality stay the seeds'."""
    answer = broker.AskUserQuestionAnswer(answers=())
    assert isinstance(vars(broker.AskUserQuestionAnswer).get("answered_by"), property)
    assert answer.answered_by is None
    assert "answered_by" not in broker.AskUserQuestionAnswer.__struct_fields__
    with pytest.raises(AttributeError):
        answer.answered_by = "mallory"  # type: ignore[misc]
