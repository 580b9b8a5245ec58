"""A filtered API page walks the cards its filter keeps, not every pending card (the issue "The page a team trusts
at fleet size": one agent of 1 000 at 100 000 pending took 570 ms). The index follows every change: a filtered page
never shows a card settled or withdrawn, and never misses one that joined its agent or its priority."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from broker import AskUserQuestionRequest
from tests.helpers import one_question
from tests.web.served import ask_many_and_rare, web_service
from workers.answering.web.cards import card_tags, pending_tags
from workers.answering.web.service import WebProvider, filter_tags

_FILTERS: list[dict[str, str]] = [
    {"agent": "many"},
    {"agent": "rare"},
    {"agent": "joiner"},
    {"priority": "urgent"},
    {"priority": "normal"},
    {"intent": "plan-review"},
    {"intent": "none", "agent": "many"},
]


def _keeps(
    view: dict[str, Any], agent: str | None = None, priority: str | None = None, intent: str | None = None
) -> bool:
    """The API's filters (``app._requests_page``), read off a view."""
    if agent is not None and view["agent"] != agent and all(a["agent"] != agent for a in view["askers"]):
        return False
    if priority is not None and view["priority"] != priority:
        return False
    kinds = {"plan-review" if q.get("planReview") else "none" for q in view["questions"]}
    return intent is None or intent in kinds


def _page(service: WebProvider, filters: dict[str, str], judged: list[str] | None = None) -> list[str]:
    def wanted(view: dict[str, Any]) -> bool:
        if judged is not None:
            judged.append(view["id"])
        return _keeps(view, **filters)

    views, _ = service.page(0, 100, wanted, filter_tags(**filters))
    return [view["id"] for view in views]


def _walked(service: WebProvider, filters: dict[str, str]) -> list[str]:
    """The same filter over every pending card, in the order shown: what the index must agree with."""
    return [view["id"] for view in service.requests() if _keeps(view, **filters)]


def _agree(service: WebProvider) -> None:
    for filters in _FILTERS:
        assert _page(service, filters) == _walked(service, filters), filters
    for request_id, pending in service.cards.pending.items():  # an unbuilt card is filed by what its view would say
        assert pending_tags(pending) == card_tags(service.view_of(request_id) or {}), request_id


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.02)


@pytest.mark.timeout(40)
async def test_a_filtered_page_follows_cards_settled_withdrawn_joined_and_raised(
    make_broker: Callable[..., Any], namespace: str
) -> None:
    asking, web = await make_broker(), await make_broker()
    async with (
        web_service(web, namespace) as (service, asks),
        asyncio.timeout(35),
        asking.agent("many") as many,
        asking.agent("rare") as rare,
        asking.agent("joiner") as joiner,
    ):
        await ask_many_and_rare(service, many, rare, asks, timeout=30)
        _agree(service)

        judged: list[str] = []
        (rares,) = _page(service, {"agent": "rare"}, judged)
        assert set(judged) == {
            rares
        }  # only rare's card was judged (on what filters read, then built), not the 7 others

        # Another agent asks what "many" asked: it joins that card, and its filtered page has it.
        card = _page(service, {"agent": "many"})[2]
        joined = asyncio.create_task(joiner.ask(one_question("a2", "b2"), timeout=30))
        await _until(lambda: _page(service, {"agent": "joiner"}) == [card])
        _agree(service)
        # It asks once more, urgently: that card goes to the urgent level, and to the urgent page.
        urgent = AskUserQuestionRequest(questions=one_question("a3", "b3").questions, priority="urgent")
        raised = _page(service, {"agent": "many"})[3]
        asks.append(asyncio.create_task(joiner.ask(urgent, timeout=30)))
        await _until(lambda: _page(service, {"priority": "urgent"}) == [raised])
        assert _page(service, {"agent": "joiner"}) == [raised, card]
        _agree(service)

        # It stops waiting for the first: the card stays for "many" and leaves the joiner's page.
        joined.cancel()
        await asyncio.gather(joined, return_exceptions=True)
        await _until(lambda: _page(service, {"agent": "joiner"}) == [raised])
        _agree(service)

        # Settled, a card is on no page; withdrawn, the same.
        await service.cancel(rares, "not now", by="alice")
        assert _page(service, {"agent": "rare"}) == []
        asks[0].cancel()
        await _until(lambda: len(service.requests()) == 6)
        _agree(service)
