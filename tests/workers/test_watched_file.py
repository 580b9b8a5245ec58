"""``workers._watched_file``: a settings file read again when it changes, on real files."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from workers._watched_file import WatchedFile


def parse(text: str) -> tuple[str, ...]:
    if "!" in text:
        raise ValueError("a line with '!' is malformed")
    return tuple(text.split())


class Parsed:
    """``parse``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> tuple[str, ...]:
        self.calls += 1
        return parse(text)


def watched(path: Path, clock: Callable[[], int] = time.time_ns) -> WatchedFile[tuple[str, ...]]:
    return WatchedFile(path, parse, missing=(), code="TEST_FILE_INVALID", clock=clock)


def write(path: Path, text: str) -> None:
    with path.open("w") as out:  # in place: the same inode, as an editor or `>` writes
        out.write(text)


def watched_with(tmp_path: Path, text: str) -> tuple[Path, WatchedFile[tuple[str, ...]]]:
    """A file ``f`` in ``tmp_path`` written with ``text``, and it watched."""
    path = tmp_path / "f"
    write(path, text)
    return path, watched(path)


def test_a_change_is_read_at_the_next_use_and_listeners_are_told(tmp_path: Path) -> None:
    path, file = watched_with(tmp_path, "alice bob")
    told: list[tuple[str, ...]] = []
    file.on_change(told.append)
    assert file.current() == ("alice", "bob")
    write(path, "alice")
    assert file.last == ("alice", "bob")  # `last` does not look at the file
    assert file.current() == ("alice",) and told == [("alice",)]


def test_an_unchanged_file_is_parsed_once(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write(path, "alice")
    parsed = Parsed()
    long_after = 2**62  # the file's last change is long past: its stat alone tells
    file: WatchedFile[tuple[str, ...]] = WatchedFile(path, parsed, missing=(), code="X", clock=lambda: long_after)
    for _ in range(100):
        assert file.current() == ("alice",)
    assert parsed.calls == 1


def test_a_same_size_rewrite_within_the_file_systems_clock_tick_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system whose timestamps tick in seconds (ext3, HFS+; FAT in two): a new password hash of
    the same length, written within the same second, leaves the stat exactly as it was."""
    real_stat = os.stat

    def coarse(path: str) -> os.stat_result:
        found = real_stat(path)
        fields = list(found)
        return os.stat_result((*fields[:7], 1_000, 1_000, 1_000), {"st_mtime_ns": 10**18, "st_ctime_ns": 10**18})

    monkeypatch.setattr(os, "stat", coarse)  # what the module calls
    path = tmp_path / "f"
    write(path, "alice-old-hash")
    file = watched(path, clock=lambda: 10**18 + 10**8)  # read 0.1 s after the tick it was written in
    stamp = file._stat()
    write(path, "alice-new-hash")
    assert file._stat() == stamp  # the premise: nothing in the stat tells
    assert file.current() == ("alice-new-hash",)


def test_a_file_turned_bad_keeps_the_last_good_content_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, file = watched_with(tmp_path, "alice bob")
    write(path, "alice !")
    with caplog.at_level(logging.ERROR, logger="workers._watched_file"):
        assert file.current() == ("alice", "bob")
        assert file.current() == ("alice", "bob")
    assert [r.getMessage() for r in caplog.records] == [
        "TEST_FILE_INVALID: a line with '!' is malformed; what it said before still holds until it is mended"
    ]
    path.write_bytes(b"\xff\xfe")
    assert file.current() == ("alice", "bob")  # not UTF-8: still the last good
    write(path, "carol")
    assert file.current() == ("carol",)


def test_an_unreadable_file_keeps_the_last_good_content(tmp_path: Path) -> None:
    path, file = watched_with(tmp_path, "alice")
    os.replace(path, tmp_path / "f.bak")
    path.mkdir()  # unreadable even by root
    assert file.current() == ("alice",)
    path.rmdir()
    write(path, "bob")
    assert file.current() == ("bob",)


def test_a_file_that_is_gone_reads_as_missing_until_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, file = watched_with(tmp_path, "alice")
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="workers._watched_file"):
        assert file.current() == ()
        assert file.current() == ()
    assert len(caplog.records) == 1 and "TEST_FILE_INVALID" in caplog.records[0].getMessage()
    write(path, "alice")
    assert file.current() == ("alice",)


@pytest.mark.parametrize("text", ["alice !", None], ids=["malformed", "missing"])
def test_a_file_that_cannot_be_read_at_start_is_an_error(tmp_path: Path, text: str | None) -> None:
    path = tmp_path / "f"
    if text is not None:
        write(path, text)
    with pytest.raises((ValueError, OSError)):
        watched(path)
