"""The soak runs small: asks while the active provider is SIGKILLed; nothing lost, nothing doubled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.soak import Result, tally

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_small_soak_loses_nothing_and_answers_nothing_twice() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--asks", "200", "--kills", "2", "--seed", "1", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=55,
    )
    assert result.stdout, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["lost"] == 0 and figures["duplicates"] == 0, figures
    assert figures["answers"] == figures["audit_asked"] == figures["audit_answered"] == 200, figures
    assert figures["kills"] == 2 and figures["failovers"] >= 2, figures
    assert len(figures["epochs"]) >= 3, figures  # three holders answered: the first and two successors
    assert figures["wrong_answers"] == 0 and figures["errors"] == {} and figures["stream_left"] == 0, figures
    assert result.returncode == 0 and figures["ok"] is True


@pytest.mark.slow
def test_soak_with_keyed_askers_killed_and_restarted() -> None:
    """Issue 14: `qbroker ask --key` processes SIGKILLed mid-question and run again: each key gets its one answer."""
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--asks", "100", "--kills", "1", "--seed", "2",
         "--keyed", "12", "--keyed-kills", "6", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=80,
    )  # fmt: skip
    assert result.stdout, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["keyed_kills"] >= 3, figures  # most kills land while the question is out (think time 0.4 s)
    assert figures["keyed_answers"] == 12 and figures["keyed_wrong"] == 0, figures
    assert figures["keyed_asked_twice"] == 0 and figures["keyed_failed"] == {}, figures
    assert figures["duplicates"] == 0 and figures["lost"] == 0 and figures["audit_other"] == {}, figures
    assert result.returncode == 0 and figures["ok"] is True


def events(*pairs: tuple[str, str]) -> list[tuple[str, str, str]]:
    return [(event, rid, "1") for event, rid in pairs]


def test_the_tally_finds_a_request_answered_twice_and_one_never_answered() -> None:
    clean = Result(asks=2, answers=2)
    tally(clean, events(("asked", "a"), ("asked", "b"), ("answered", "a"), ("answered", "b")))
    assert (clean.duplicates, clean.lost, clean.ok) == (0, 0, True)

    doubled = Result(asks=2, answers=2)
    tally(doubled, events(("asked", "a"), ("asked", "b"), ("answered", "a"), ("answered", "b"), ("answered", "a")))
    assert (doubled.duplicates, doubled.lost, doubled.ok) == (1, 0, False)

    lost = Result(asks=2, answers=1)
    tally(lost, events(("asked", "a"), ("asked", "b"), ("answered", "a"), ("withdrawn", "b")))
    assert (lost.duplicates, lost.lost, lost.ok, lost.audit_other) == (0, 1, False, {"withdrawn": 1})

    unseen = Result(asks=3, answers=3)  # the audit lost an ask (trimmed before it was read)
    tally(unseen, events(("asked", "a"), ("asked", "b"), ("answered", "a"), ("answered", "b")))
    assert unseen.lost == 1 and not unseen.ok
