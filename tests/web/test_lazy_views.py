"""A card's view is built when asked for, not kept for every pending card (issue 27): what a page is
shown of a card is the same whenever it is built, and a change to who asks still reaches the pages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import one_question, plan_review
from tests.web.served import ask_many_and_rare, web_service
from workers.answering.web.service import Event


async def _next(queue: asyncio.Queue[Event | None], kind: str) -> Event:
    while True:
        event = await queue.get()
        assert event is not None, "the page's stream ended"
        if event["type"] == kind:
            return event


@pytest.mark.timeout(30)
async def test_a_card_shows_the_same_view_when_asked_for_later_and_a_joining_asker_is_announced(
    make_broker: Callable[..., Any], namespace: str
) -> None:
    first, second, web = await make_broker(), await make_broker(), await make_broker()
    async with (
        web_service(web, namespace) as (service, asks),
        asyncio.timeout(25),
        first.agent("builder") as builder,
        second.agent("tester") as tester,
        service.subscribe() as queue,
    ):
        asks.append(asyncio.create_task(builder.ask(one_question("yes", "no"), timeout=25)))
        shown = (await _next(queue, "added"))["request"]
        assert service.view_of(shown["id"]) == shown
        assert service.requests() == [shown]
        assert service.page(0, 10, lambda view: True)[0] == [shown]

        # Another agent asks the same: it joins the card, and pages are told who asks now.
        asks.append(asyncio.create_task(tester.ask(one_question("yes", "no"), timeout=25)))
        updated = await _next(queue, "updated")
        assert updated["id"] == shown["id"]
        assert [asker["agent"] for asker in updated["askers"]] == ["builder", "tester"]
        view = service.view_of(shown["id"])
        assert view is not None
        assert [asker["agent"] for asker in view["askers"]] == ["builder", "tester"]
        assert {name: value for name, value in view.items() if name != "askers"} == {
            name: value for name, value in shown.items() if name != "askers"
        }


@pytest.mark.timeout(30)
async def test_a_card_taken_down_before_its_view_was_built_stays_in_the_history(
    make_broker: Callable[..., Any], namespace: str
) -> None:
    asking, web = await make_broker(), await make_broker()
    async with (
        web_service(web, namespace) as (service, asks),
        asyncio.timeout(25),
        asking.agent("builder") as builder,
        service.subscribe() as queue,
    ):
        asks.append(asyncio.create_task(builder.ask(plan_review(), timeout=25)))
        shown = (await _next(queue, "added"))["request"]
        await service.cancel(shown["id"], "not now", by="alice")
        assert (await _next(queue, "removed"))["id"] == shown["id"]
        assert service.shown(shown["id"]) == {
            "agent": "builder",
            "questions": [{"id": "plan", "question": shown["questions"][0]["question"], "approve": "Approve"}],
            "routes": None,  # not routed (History shows it to everyone)
        }


@pytest.mark.timeout(30)
async def test_a_filtered_page_builds_views_only_for_the_cards_it_returns(
    make_broker: Callable[..., Any], namespace: str
) -> None:
    """An API page filtered by agent, priority or intent judges unbuilt cards on what the filter reads and
    builds the view of the wanted ones only: the same answer as filtering built views, and the cards it
    passes over stay unbuilt (at 100 000 pending a rare agent's page built a view per card it passed)."""
    from workers.answering.web.cards import Unbuilt

    asking, web = await make_broker(), await make_broker()
    async with (
        web_service(web, namespace) as (service, asks),
        asyncio.timeout(25),
        asking.agent("many") as many,
        asking.agent("rare") as rare,
    ):
        await ask_many_and_rare(service, many, rare, asks, timeout=25)
        ids = [view["id"] for view in service.requests()]
        assert all(isinstance(service.cards.views[rid], Unbuilt) for rid in ids)  # the fault can fire
        by_rare, _ = service.page(0, 10, lambda view: view["agent"] == "rare")
        reviews, _ = service.page(0, 10, lambda view: any(q.get("planReview") for q in view["questions"]))
        everything, _ = service.page(0, 10, lambda view: True)
        assert [v["agent"] for v in by_rare] == ["rare"]
        assert len(reviews) == 1 and reviews[0]["questions"][0]["planReview"]
        assert by_rare[0] in everything and reviews[0] in everything
        assert all(isinstance(service.cards.views[rid], Unbuilt) for rid in ids)  # nothing kept built either
        assert (
            service.cards.filtered(service.cards.pending[by_rare[0]["id"]]).items()
            <= {
                **by_rare[0],
                "questions": [{"planReview": q["planReview"]} for q in by_rare[0]["questions"]],
            }.items()
        )
