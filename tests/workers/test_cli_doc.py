"""docs/cli.md against the parser behind each `qbroker COMMAND --help`: every command and flag, nothing stale."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from workers.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
_FLAG = re.compile(r"`(--?[a-zA-Z][\w-]*)")


def _sections() -> dict[str, str]:
    """Each `## ...` section of cli.md, keyed by the command its heading names (or the heading)."""
    found = {}
    for chunk in DOC.read_text().split("\n## ")[1:]:
        heading = chunk.splitlines()[0]
        named = re.match(r"`qbroker ([\w-]+)", heading)
        found[named.group(1) if named else heading] = chunk
    return found


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _shared() -> set[str]:
    return {o for a in build_parser()._actions for o in a.option_strings if o not in ("-h", "--help")}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings} - {"-h", "--help"}


def test_every_command_has_a_section():
    assert set(_commands()) <= set(_sections())


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_flag_of_the_help_is_documented(command):
    section = _sections()[command]
    documented = set(_FLAG.findall(section))
    own = _flags(_commands()[command]) - _shared()
    if command == "web":  # it defines its own --redis-url, --namespace, --lease-ttl: document them too
        own = _flags(_commands()[command]) - {"--log-level", "--log-json"}
    assert own - documented == set(), f"docs/cli.md `qbroker {command}` misses {sorted(own - documented)}"


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_documented_flag_exists(command):
    section = _sections()[command]
    known = _flags(_commands()[command]) | _shared()
    stale = set(_FLAG.findall(section)) - known
    assert stale == set(), f"docs/cli.md `qbroker {command}` names flags it does not have: {sorted(stale)}"


def test_the_shared_flags_are_documented_once():
    table = _sections()["Shared flags and environment"]
    assert _shared() - set(_FLAG.findall(table)) == set()
