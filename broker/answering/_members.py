"""The askers of one card (identical requests of several askers), kept so that a fleet is cheap.

A card of 16 000 askers is asked, per joining asker, whether that asker is already on it and how
urgent it now is; answering it forgets each asker once. Every one of those is O(1) here: the
members are kept by request id, with running counts of what the card's properties summarise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar, overload

from ..types import PRIORITIES, AskUserQuestionRequest
from ._schedule import LEVELS

__all__ = ["Members"]


class Member(Protocol):
    request_id: str
    request: AskUserQuestionRequest
    client_id: str
    away: bool
    opted_out: bool


M = TypeVar("M", bound=Member)


def _level(member: Member) -> int:
    return LEVELS.get(member.request.priority, 1)


class Members(Generic[M]):
    """A card's members in arrival order, by request id, with counts by level, asker and state.

    An asker is an agent id in one asking process (``client_id``); a member's ``away`` and
    ``client_id`` and ``opted_out`` change only through ``set_away``, ``rebind`` and ``set_opted_out``, which keep
    the counts true.
    """

    __slots__ = ("_askers", "_by_id", "_levels", "away", "opted_out")

    def __init__(self, first: M) -> None:
        self._by_id: dict[str, M] = {}
        self._levels = [0] * len(PRIORITIES)
        self._askers: Counter[tuple[str | None, str]] | None = None
        """members by asker, counted from a card's second member on (a web page holds 100 000 cards of one)"""
        self.away = 0
        """how many members' askers stopped"""
        self.opted_out = 0
        """how many members opted out of remembered decisions"""
        self.add(first)

    def __iter__(self) -> Iterator[M]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    @overload
    def __getitem__(self, index: int) -> M: ...

    @overload
    def __getitem__(self, index: slice) -> list[M]: ...

    def __getitem__(self, index: int | slice) -> M | list[M]:
        if index == 0:
            return next(iter(self._by_id.values()))
        return list(self._by_id.values())[index]

    @property
    def level(self) -> int:
        """The most urgent member's level (0 is urgent)."""
        for level, count in enumerate(self._levels):  # a loop: a card's level is read a few times per delivery
            if count:
                return level
        return LEVELS["normal"]

    def get(self, request_id: str) -> M | None:
        return self._by_id.get(request_id)

    def has_asker(self, member: Member) -> bool:
        """Whether the asker of ``member`` (its agent in its asking process) is on the card already."""
        asker = (member.request.agent, member.client_id)
        if self._askers is None:
            return any((mine.request.agent, mine.client_id) == asker for mine in self._by_id.values())
        return self._askers[asker] > 0

    def add(self, member: M) -> None:
        if self._askers is None and self._by_id:
            self._askers = Counter((mine.request.agent, mine.client_id) for mine in self._by_id.values())
        self._by_id[member.request_id] = member
        self._levels[_level(member)] += 1
        if self._askers is not None:
            self._askers[(member.request.agent, member.client_id)] += 1
        self.away += member.away
        self.opted_out += member.opted_out

    def remove(self, request_id: str) -> M | None:
        member = self._by_id.pop(request_id, None)
        if member is not None:
            self._levels[_level(member)] -= 1
            self._uncount_asker(member)
            self.away -= member.away
            self.opted_out -= member.opted_out
        return member

    def set_away(self, member: M, away: bool) -> None:
        if self._by_id.get(member.request_id) is member and member.away != away:
            self.away += 1 if away else -1
        member.away = away

    def set_opted_out(self, member: M, opted_out: bool) -> None:
        """The member's asker re-attached with another ``remember`` (the request hash's word)."""
        if self._by_id.get(member.request_id) is member and member.opted_out != opted_out:
            self.opted_out += 1 if opted_out else -1
        member.opted_out = opted_out

    def rebind(self, member: M, client_id: str) -> None:
        """The member's asker re-attached from another asking process."""
        counted = self._by_id.get(member.request_id) is member
        if counted:
            self._uncount_asker(member)
        member.client_id = client_id
        if counted and self._askers is not None:
            self._askers[(member.request.agent, client_id)] += 1

    def _uncount_asker(self, member: M) -> None:
        if self._askers is None:
            return
        asker = (member.request.agent, member.client_id)
        self._askers[asker] -= 1
        if self._askers[asker] <= 0:
            del self._askers[asker]
