"""``Lineup`` keeps the live cards in ``in_schedule_order``'s order as they come, go and change
level, and ``Members`` keeps a card's summaries true as askers join and leave. No Redis."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import AskUserQuestionRequest
from broker.answering._members import Members
from broker.answering._schedule import Lineup, in_schedule_order
from tests.helpers import one_question

PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None)


@dataclass(eq=False)
class Card:
    agent_id: str | None
    created_ms: int
    level: int
    name: str = ""


# -- Lineup -----------------------------------------------------------------------------------

operation = st.one_of(
    st.tuples(st.just("add"), st.sampled_from([None, "a", "b", "c", "d"]), st.integers(0, 6), st.integers(0, 2)),
    st.tuples(st.just("remove"), st.integers(0, 60)),
    st.tuples(st.just("move"), st.integers(0, 60), st.integers(0, 2)),
)


@PROPERTY
@given(st.lists(operation, max_size=60))
def test_the_lineup_is_in_schedule_order_after_any_adds_removes_and_level_changes(operations) -> None:
    lineup: Lineup[Card] = Lineup()
    live: list[Card] = []  # in arrival order: what in_schedule_order breaks ties of age by
    for op in operations:
        if op[0] == "add":
            card = Card(agent_id=op[1], created_ms=op[2], level=op[3])
            lineup.add(card)
            live.append(card)
        elif live and op[0] == "remove":
            card = live.pop(op[1] % len(live))
            lineup.remove(card)
        elif live and op[0] == "move":
            card = live[op[1] % len(live)]
            card.level = op[2]
            lineup.move(card)
        expected = in_schedule_order(live)
        assert len(lineup) == len(live)
        for n in range(len(live) + 2):
            assert lineup.first(n) == expected[:n]


def test_first_reads_only_the_first_round_when_many_agents_wait() -> None:
    lineup: Lineup[Card] = Lineup()
    cards = [Card(agent_id=f"agent{n}", created_ms=1000 - n, level=1) for n in range(1000)]
    for card in cards:
        lineup.add(card)
    assert lineup.first(3) == [cards[999], cards[998], cards[997]]  # the oldest three
    lineup.remove(cards[998])
    assert lineup.first(2) == [cards[999], cards[997]]


def test_one_chatty_agent_does_not_push_another_agents_single_card_back() -> None:
    lineup: Lineup[Card] = Lineup()
    flood = [Card(agent_id="chatty", created_ms=n, level=1) for n in range(50)]
    for card in flood:
        lineup.add(card)
    quiet = Card(agent_id="quiet", created_ms=100, level=1)
    lineup.add(quiet)
    assert lineup.first(3) == [flood[0], quiet, flood[1]]


def test_removing_an_unknown_card_or_moving_it_changes_nothing() -> None:
    lineup: Lineup[Card] = Lineup()
    kept, stranger = Card("a", 1, 1), Card("b", 2, 0)
    lineup.add(kept)
    lineup.remove(stranger)
    lineup.move(stranger)
    assert (len(lineup), lineup.first(5)) == (1, [kept])


# -- Members ----------------------------------------------------------------------------------


@dataclass(eq=False, kw_only=True)
class Member:
    request_id: str
    request: AskUserQuestionRequest = field(default_factory=one_question)
    client_id: str = "c1"
    away: bool = False
    opted_out: bool = False


def asked(request_id: str, agent: str | None, priority: str = "normal", **fields: object) -> Member:
    request = AskUserQuestionRequest(questions=one_question().questions, agent=agent, priority=priority)
    return Member(request_id=request_id, request=request, **fields)  # type: ignore[arg-type]


def test_the_level_follows_the_most_urgent_member_as_members_join_and_leave() -> None:
    members = Members(asked("r1", "a1", "low"))
    assert members.level == 2
    members.add(asked("r2", "a2", "normal"))
    members.add(asked("r3", "a3", "urgent"))
    assert members.level == 0
    members.remove("r3")  # the only urgent one left
    assert members.level == 1
    members.remove("r2")
    assert members.level == 2


def test_two_urgent_members_keep_the_card_urgent_until_both_left() -> None:
    members = Members(asked("r1", "a1", "urgent"))
    members.add(asked("r2", "a2", "urgent"))
    members.remove("r1")
    assert members.level == 0
    members.add(asked("r3", "a3"))
    members.remove("r2")
    assert members.level == 1


def test_an_asker_is_its_agent_in_its_process_and_leaving_or_moving_process_updates_it() -> None:
    first = asked("r1", "a1", client_id="c1")
    members = Members(first)
    assert members.has_asker(asked("x", "a1", client_id="c1"))
    assert not members.has_asker(asked("x", "a1", client_id="c2"))  # the same agent id in another process
    assert not members.has_asker(asked("x", None, client_id="c1"))  # an agentless ask of that process
    members.rebind(first, "c2")  # re-attached from a new process
    assert first.client_id == "c2"
    assert members.has_asker(asked("x", "a1", client_id="c2"))
    assert not members.has_asker(asked("x", "a1", client_id="c1"))
    second = asked("r2", None, client_id="c1")
    members.add(second)
    members.remove("r2")
    assert not members.has_asker(second)


def test_one_asker_on_a_card_twice_is_still_an_asker_after_one_of_them_leaves() -> None:
    members = Members(asked("r1", "a1"))
    members.add(asked("r2", "a1"))  # Members allows it; Provider._place never puts it there
    members.remove("r1")
    assert members.has_asker(asked("x", "a1"))


@pytest.mark.parametrize("leaving", ["r1", "r2"])
def test_away_and_opted_out_counts_follow_joins_leaves_and_changes(leaving: str) -> None:
    one, two = asked("r1", "a1", away=True), asked("r2", "a2", opted_out=True)
    members = Members(one)
    members.add(two)
    assert (members.away, members.opted_out, len(members)) == (1, 1, 2)
    members.set_away(two, True)
    members.set_away(two, True)  # told twice: counted once
    assert members.away == 2
    members.remove(leaving)
    assert (members.away, members.opted_out) == (1, 0 if leaving == "r2" else 1)
    stayed = members[0]
    members.set_away(stayed, False)
    assert members.away == 0 and list(members) == [stayed]


def test_members_keep_arrival_order_and_index_like_a_list() -> None:
    members = Members(asked("r1", "a1"))
    for n in range(2, 6):
        members.add(asked(f"r{n}", f"a{n}"))
    members.remove("r3")
    assert [m.request_id for m in members] == ["r1", "r2", "r4", "r5"]
    assert members[0].request_id == "r1" and members[2].request_id == "r4"
    assert [m.request_id for m in members[:2]] == ["r1", "r2"]
    assert members.get("r3") is None and members.remove("r3") is None
