"""docs/protocol.md documents every script with as many KEYS and ARGV as the script takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "broker" / "scripts").glob("*.lua"))
DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")


def _highest(source: str, kind: str) -> int:
    return max((int(n) for n in re.findall(rf"{kind}\[(\d+)\]", source)), default=0)


def _documented(name: str) -> tuple[int, int]:
    """The highest KEYS and ARGV numbers in the script's section (or its table row)."""
    section = re.search(rf"^### {re.escape(name)}\.lua(?: \([^\n]*\))?$.*?(?=^#{{2,3}} )", DOC, re.S | re.M)
    if section is not None:
        keys = re.search(r"^\| KEYS \|(.*)$", section.group(0), re.M).group(1)  # type: ignore[union-attr]
        argv = re.search(r"^\| ARGV \|(.*)$", section.group(0), re.M).group(1)  # type: ignore[union-attr]
    else:
        row = re.search(rf"^\| `{re.escape(name)}` \|.*$", DOC, re.M)
        assert row is not None, f"docs/protocol.md documents no {name}.lua"
        keys, argv = row.group(0).split("|")[2:4]
    return _max_item(keys), _max_item(argv)


def _max_item(cell: str) -> int:
    return max((int(n) for n in re.findall(r"(?:^|·)\s*(\d+)\s", cell)), default=0)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_every_script_contract_is_documented(script: Path) -> None:
    source = script.read_text(encoding="utf-8")
    assert _documented(script.stem) == (_highest(source, "KEYS"), _highest(source, "ARGV"))
