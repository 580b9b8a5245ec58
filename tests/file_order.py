"""The order the suite's files are handed out in: the longest first.

``pytest -n 3 --dist loadfile`` hands a process one file at a time. By default xdist orders the files by
their number of tests, most first, so a file of one long test (test_soak_keyed.py, a 45 s soak) started
near the end while the other processes ran out of files (about 20 s of a quiet run's 8:30 went that way).
With ``--no-loadscope-reorder`` (pyproject's addopts) it keeps the order of collection, which
tests/conftest.py sets from tests/file_seconds.json: each file's seconds in a measured run (only their
sizes against each other count). A file it does not know counts a second per test.

Refresh the figures after a full run: ``pytest -n 3 --dist loadfile --junitxml=run.xml``, then
``python -m tests.file_order run.xml``.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

SECONDS = Path(__file__).with_name("file_seconds.json")


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with each file's tests together and in their order, the files longest first."""
    known: dict[str, float] = json.loads(SECONDS.read_text()) if SECONDS.exists() else {}
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(files.items(), key=lambda entry: -known.get(entry[0], float(len(entry[1]))))
    return [item for _, tests in ordered for item in tests]


def main(junit_xml: str) -> None:
    """Write tests/file_seconds.json from a run's JUnit XML (each test's setup, call and teardown)."""
    seconds: dict[str, float] = {}
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        module = [part for part in case.get("classname", "").split(".") if not part[:1].isupper()]
        name = "/".join(module) + ".py"
        seconds[name] = seconds.get(name, 0.0) + float(case.get("time", "0"))
    SECONDS.write_text(
        json.dumps({name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda e: -e[1])}, indent=0) + "\n"
    )


if __name__ == "__main__":
    main(sys.argv[1])
