"""The order a provider presents its pending requests in, and which of them are one question.

Urgent first, then normal, then low; within a level, round-robin across asking agents, each
agent's oldest first: 500 questions from one agent cannot push another agent's single question
to the back. Identical requests (same ``request_fingerprint``) from several askers are one card.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from .types import PRIORITIES, AskUserQuestionRequest, encode

__all__ = ["LEVELS", "Schedule", "in_schedule_order", "request_fingerprint"]

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
