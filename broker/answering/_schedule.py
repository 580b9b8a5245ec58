"""The order a provider presents its pending requests in, and which of them are one question.

Urgent first, then normal, then low; within a level, round-robin across asking agents, each
agent's oldest first: 500 questions from one agent cannot push another agent's single question
to the back. Identical requests (same ``request_fingerprint``) from several askers are one card.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import itertools
import operator
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from ..types import PRIORITIES, AskUserQuestionRequest, encode

__all__ = ["LEVELS", "Lineup", "Schedule", "in_schedule_order", "request_fingerprint"]

_AGE = operator.itemgetter(0, 1)
"""a filed card's (created_ms, seq): its place among its agent's cards"""

LEVELS = {priority: level for level, priority in enumerate(PRIORITIES)}
"""a priority's level: 0 is presented first"""


class Card(Protocol):
    @property
    def level(self) -> int: ...

    @property
    def agent_id(self) -> str | None: ...

    @property
    def created_ms(self) -> int: ...


C = TypeVar("C", bound=Card)


def request_fingerprint(request: AskUserQuestionRequest) -> str:
    """What makes two pending requests one question to a human: everything shown, ids excluded.

    Stricter than a remembered decision's fingerprint: a question's ``detail`` (a plan under
    review) and the options' descriptions count, so one answer never settles two requests
    that a human would have read differently. The agent and the priority do not count.
    """
    shown = [
        [
            item.question,
            item.header,
            item.detail,
            [[option.label, option.description] for option in item.options or ()],
            item.multi_select,
            item.intent,
            # Only when present, so a request without it keeps its fingerprint: one edit is made
            # to one set of arguments, and must not be sent to a call whose arguments differ.
            *([item.editable] if item.editable is not None else []),
        ]
        for item in request.questions
    ]
    return hashlib.sha256(encode(shown)).hexdigest()


class Schedule(Generic[C]):
    """Cards waiting to be handed out, in presentation order; O(1) per push and pop.

    A card pushed again (at a higher level, when an urgent asker joined it) leaves a stale
    entry behind, which ``pop`` skips: ``ready(card, level)`` says whether an entry still counts.
    """

    def __init__(self) -> None:
        self._levels: list[OrderedDict[str, deque[C]]] = [OrderedDict() for _ in PRIORITIES]

    def push(self, card: C, level: int, agent_id: str | None) -> None:
        # An agent new to the level queues behind those already waiting there: its turn
        # comes after each of theirs, not after all of their questions.
        self._levels[level].setdefault(agent_id or "", deque()).append(card)

    def pop(self, ready: Callable[[C, int], bool]) -> C | None:
        for level, agents in enumerate(self._levels):
            while agents:
                agent_id, waiting = next(iter(agents.items()))
                card = waiting.popleft()
                if waiting:
                    agents.move_to_end(agent_id)  # its next question waits for every other agent's turn
                else:
                    del agents[agent_id]
                if ready(card, level):
                    return card
        return None


class Lineup(Generic[C]):
    """The live cards in ``in_schedule_order``'s order, kept up to date as cards come, go and change level.

    ``first(n)`` costs O(n log n + log N) with N cards, not a sort of all N: per level, each
    agent's cards are a list in age order, and a heap holds every agent's oldest card (the
    round-robin's first round). A later round is reached only when fewer than n agents wait at
    that level, so it orders fewer than n cards. Adding and removing a card cost O(log N) plus
    the shift of that agent's list.
    """

    def __init__(self) -> None:
        self._lines: list[dict[str, list[tuple[int, int, C]]]] = [{} for _ in PRIORITIES]
        """per level: agent -> its cards as (created_ms, seq, card), oldest first"""
        self._heads: list[list[tuple[int, int, int, str]]] = [[] for _ in PRIORITIES]
        """per level: a heap of (created_ms, seq, stamp, agent) of each agent's oldest card; stale
        entries (a stamp no longer the agent's) are dropped when met"""
        self._stamps: list[dict[str, int]] = [{} for _ in PRIORITIES]
        self._where: dict[C, tuple[int, int]] = {}
        """card -> (the level it is filed at, its seq: arrival order, which breaks ties of age)"""
        self._seqs = itertools.count()
        self._next_stamp = itertools.count()

    def __len__(self) -> int:
        return len(self._where)

    def add(self, card: C) -> None:
        self._file(card, card.level, next(self._seqs))

    def remove(self, card: C) -> None:
        where = self._where.pop(card, None)
        if where is not None:
            self._unfile(card, *where)

    def move(self, card: C) -> None:
        """The card's level changed (an urgent asker joined or left it)."""
        where = self._where.get(card)
        if where is not None and where[0] != card.level:
            self._unfile(card, *where)
            self._file(card, card.level, where[1])

    def first(self, n: int) -> list[C]:
        """The first ``n`` cards in ``in_schedule_order``'s order."""
        cards: list[C] = []
        for level in range(len(PRIORITIES)):
            if len(cards) >= n:
                break
            cards += self._first_at(level, n - len(cards))
        return cards

    def _first_at(self, level: int, n: int) -> list[C]:
        heap, stamps, lines = self._heads[level], self._stamps[level], self._lines[level]
        heads: list[tuple[int, int, int, str]] = []
        while heap and len(heads) < n:
            head = heapq.heappop(heap)
            if stamps.get(head[3]) == head[2]:
                heads.append(head)
        for head in heads:
            heapq.heappush(heap, head)
        cards = [lines[head[3]][0][2] for head in heads]
        if len(heads) < n:  # every agent's first card is in: later rounds, among fewer than n agents
            agents = [head[3] for head in heads]
            rank = 1
            while agents and len(cards) < n:
                agents = [agent for agent in agents if len(lines[agent]) > rank]
                turn = sorted((lines[agent][rank] for agent in agents), key=_AGE)
                cards += [card for _, _, card in turn[: n - len(cards)]]
                rank += 1
        return cards

    def _file(self, card: C, level: int, seq: int) -> None:
        self._where[card] = (level, seq)
        agent = card.agent_id or ""
        line = self._lines[level].setdefault(agent, [])
        index = bisect.bisect_left(line, (card.created_ms, seq), key=_AGE)
        line.insert(index, (card.created_ms, seq, card))
        if index == 0:
            self._new_head(level, agent, line)

    def _unfile(self, card: C, level: int, seq: int) -> None:
        agent = card.agent_id or ""
        line = self._lines[level][agent]
        index = bisect.bisect_left(line, (card.created_ms, seq), key=_AGE)
        del line[index]
        if not line:
            del self._lines[level][agent], self._stamps[level][agent]
        elif index == 0:
            self._new_head(level, agent, line)

    def _new_head(self, level: int, agent: str, line: list[tuple[int, int, C]]) -> None:
        stamp = self._stamps[level][agent] = next(self._next_stamp)
        heap = self._heads[level]
        heapq.heappush(heap, (line[0][0], line[0][1], stamp, agent))
        if len(heap) > 2 * len(self._lines[level]) + 16:  # mostly stale: rebuild from the live heads
            heap[:] = [(ln[0][0], ln[0][1], self._stamps[level][a], a) for a, ln in self._lines[level].items()]
            heapq.heapify(heap)


def in_schedule_order(cards: Iterable[C]) -> list[C]:
    """Cards in the order ``Schedule`` would hand them out had they all arrived together.

    Level first; then each agent's n-th oldest card of that level in round n; within a round,
    oldest first. The web page sorts by the same rule.
    """
    rank: Counter[tuple[int, str | None]] = Counter()
    keyed = []
    for seq, card in enumerate(sorted(cards, key=lambda card: card.created_ms)):
        turn = (card.level, card.agent_id)
        keyed.append(((card.level, rank[turn], card.created_ms, seq), card))
        rank[turn] += 1
    return [card for _, card in sorted(keyed, key=lambda pair: pair[0])]
