"""A small settings file that a running process reads again when it changes (the web's users file).

Each ``current()`` costs one ``stat``; the file is read again only when its stat changed, or while
its last change is too recent for the stat to tell a second one: a rewrite of the same size within
the file system's clock tick leaves the stat as it was (a changed password hash is the same size),
so for ``_RACY_NS`` after a change the bytes themselves are compared (git's "racily clean" entries).

A file that turns bad (unreadable, not UTF-8, malformed) keeps the content last read well: a broken
edit neither lets everyone in nor locks everyone out. It is logged with its code once per version of
the file. A file that is gone reads as ``missing`` (for a users file: nobody), logged the same way.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

__all__ = ["WatchedFile"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_Stamp = tuple[int, int, int, int]

_RACY_NS = 2_000_000_000
"""how long after a change the bytes are compared too: coarse file-system clocks tick in
milliseconds (ext4, tmpfs), some in seconds (FAT's 2 s)"""


class WatchedFile(Generic[T]):
    """``parse(text)`` of a file, read again when the file changes; ``parse`` raises ``ValueError`` for a bad file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        parse: Callable[[str], T],
        *,
        missing: T,
        code: str,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        """Reads the file now; raises ``OSError`` or ``ValueError`` when it cannot be read or parsed."""
        self.path = Path(path)
        self._file = os.fspath(self.path)
        self._parse, self._missing, self._code, self._clock = parse, missing, code, clock
        self._listeners: list[Callable[[T], None]] = []
        self._stamp = self._stat()
        text = self.path.read_bytes().decode()
        self._content = parse(text)
        self._text: str | None = text
        """the text last read, good or bad (a bad one is not parsed again until it changes)"""
        self._racy = self._recent(self._stamp)
        self._logged: tuple[_Stamp | None, str] | None = None
        """the bad version last logged, and why (logged once, not at every request)"""

    def __repr__(self) -> str:
        return f"WatchedFile(path={self._file!r})"

    @property
    def last(self) -> T:
        """The content as last read, without looking at the file."""
        return self._content

    def current(self) -> T:
        """The content now: the file is read again first if it changed."""
        self.refresh()
        return self._content

    def on_change(self, listener: Callable[[T], None]) -> Callable[[], None]:
        """Call ``listener`` with the new content whenever a change is read; returns what stops that."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def refresh(self) -> bool:
        """Read the file again if it changed; True when its content did."""
        try:
            stamp = self._stat()
        except FileNotFoundError:
            return self._gone()
        except OSError as error:
            self._bad(None, f"cannot read {self._file}: {error.strerror}")
            return False
        if stamp == self._stamp and not self._racy:
            return False
        try:
            text = self.path.read_bytes().decode()
        except FileNotFoundError:
            return self._gone()
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else "not UTF-8"
            self._bad(stamp, f"cannot read {self._file}: {reason}")
            return False
        self._racy = self._recent(stamp)
        if stamp == self._stamp and text == self._text:
            return False
        self._stamp, previous, self._text = stamp, self._text, text
        if text == previous:
            return False
        try:
            content = self._parse(text)
        except ValueError as error:
            self._bad(stamp, str(error))
            return False
        self._take(content)
        return True

    def _stat(self) -> _Stamp:
        stat = os.stat(self._file)  # os's, without pathlib's steps around it: it runs on every request
        return (stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size, stat.st_ino)

    def _recent(self, stamp: _Stamp) -> bool:
        return self._clock() - stamp[0] < _RACY_NS

    def _gone(self) -> bool:
        if self._text is None:
            return False
        self._stamp, self._text, self._racy, self._logged = (0, 0, 0, 0), None, False, None
        log.error("%s: %s is gone: nobody and nothing it named counts until it is back", self._code, self._file)
        self._take(self._missing)
        return True

    def _bad(self, stamp: _Stamp | None, reason: str) -> None:
        if (stamp, reason) != self._logged:
            log.error("%s: %s; what it said before still holds until it is mended", self._code, reason)
        self._logged = (stamp, reason)

    def _take(self, content: T) -> None:
        self._content = content
        self._logged = None
        for listener in self._listeners:
            listener(content)
