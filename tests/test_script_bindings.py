"""Each Lua script's contract header against its Python binding, and its helpers included explicitly.

broker/_lua.py loads every script; each names the helpers it uses (``--! include _audit``) and the
include line is replaced by the helper's code, so that a script's line numbers are its file's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker._lua import SCRIPTS, helpers_of

SCRIPT_DIR = Path(__file__).resolve().parent.parent / "broker" / "scripts"
FILES = sorted(SCRIPT_DIR.glob("*.lua"))
NAMES = [path.stem for path in FILES if not path.stem.startswith("_")]
HELPERS = [path.stem for path in FILES if path.stem.startswith("_")]


def _defined(helper: str) -> set[str]:
    return set(re.findall(r"^local function (\w+)\(", (SCRIPT_DIR / f"{helper}.lua").read_text(), re.M))


def _calls(source: str, function: str) -> bool:
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("--"))
    return re.search(rf"(?<![\w.]){function}\(", code) is not None


def test_every_script_file_is_loaded() -> None:
    assert sorted(SCRIPTS) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES + HELPERS)
def test_a_script_includes_exactly_the_helpers_it_calls(name: str) -> None:
    source = (SCRIPT_DIR / f"{name}.lua").read_text()
    calls = {helper for helper in HELPERS if helper != name and any(_calls(source, f) for f in _defined(helper))}
    assert set(helpers_of(source)) == calls


@pytest.mark.parametrize("name", NAMES)
def test_an_include_line_becomes_the_helpers_code_on_that_line(name: str) -> None:
    """The loaded script has the file's lines, each include replaced by its helper's code."""
    file_lines = (SCRIPT_DIR / f"{name}.lua").read_text().split("\n")
    loaded = SCRIPTS[name].source.split("\n")
    assert len(loaded) == len(file_lines)
    for file_line, line in zip(file_lines, loaded, strict=True):
        if file_line.startswith("--! include "):
            helper = file_line.removeprefix("--! include ")
            assert all(f"local function {function}(" in line for function in _defined(helper))
        else:
            assert line == file_line
    assert "--! include" not in SCRIPTS[name].source
