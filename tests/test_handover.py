"""A handover: another provider asks the lease holder to give it the lease (issue 26, item 6).

The holder's iteration ends once it has seen the request (what it already handed out it may still
settle), it releases the lease on leaving its block, and the lease goes to the provider that asked,
not back to the holder standing by again.
"""

from __future__ import annotations

import asyncio

import pytest

from broker import Broker
from tests.helpers import next_pending, one_question, pick

pytestmark = pytest.mark.timeout(30)


async def _hold_until_handover(provider_broker: Broker, name: str, holding: asyncio.Event) -> tuple[str, str, bool]:
    async with provider_broker.provider(name) as provider:
        holding.set()
        async for _pending in provider:
            pass  # nothing is asked here: the iteration ends on the handover
        assert provider.handover is not None
        return provider.handover.to, provider.handover.by, provider.lost


async def test_a_handover_ends_the_holders_iteration_and_the_lease_goes_to_who_asked(make_broker) -> None:
    terminal = await make_broker(lease_ttl=1.0)
    page = await make_broker(lease_ttl=1.0)
    holding = asyncio.Event()
    held = asyncio.create_task(_hold_until_handover(terminal, "term", holding))
    standing: list[str] = []
    # The page starts once the terminal holds the lease: started together, either could take it first.
    await asyncio.wait_for(holding.wait(), 5)
    page_side = asyncio.create_task(_take(page, "web-1", standing, hold=1.5))
    try:
        await _handed_over(terminal, page, held, holding, page_side, standing)
    finally:
        held.cancel()
        page_side.cancel()
        await asyncio.gather(held, page_side, return_exceptions=True)


async def _handed_over(terminal, page, held, holding, page_side, standing) -> None:
    await asyncio.wait_for(holding.wait(), 5)
    await asyncio.sleep(0.3)
    assert standing == ["term"]  # the page stands by behind the terminal
    await page.request_handover("web-1", by="alice")
    to, by, lost = await asyncio.wait_for(held, 5)
    assert (to, by, lost) == ("web-1", "alice", False)  # told who asks, and still holding until it leaves
    # The terminal stands by again at once, and does not take the lease back before the page.
    again: list[str] = []
    term_again = asyncio.create_task(_take(terminal, "term", again))
    await asyncio.sleep(0.5)
    assert "web-1" in await page.commands.call("GET", page.keys.provider)
    assert not term_again.done() and again == ["web-1"]
    assert await page.commands.call("EXISTS", page.keys.handover) == 0  # used up by the acquisition
    assert await asyncio.wait_for(page_side, 5) == "web-1"
    assert await asyncio.wait_for(term_again, 5) == "term"  # once the page lets go, the terminal serves again


async def _take(broker: Broker, name: str, standing: list[str], hold: float = 0.2) -> str:
    async with broker.provider(name, on_standby=standing.append) as provider:
        await asyncio.sleep(hold)
        return provider.name


async def test_a_holder_settles_what_it_handed_out_after_the_handover(make_broker) -> None:
    terminal = await make_broker(lease_ttl=1.0)
    asker = await make_broker()
    page = await make_broker(lease_ttl=1.0)
    async with terminal.provider("term") as provider:
        asking = asyncio.create_task(asker.ask(one_question(), timeout=10))
        pending = await next_pending(provider)
        await page.request_handover("web-1", by="alice")
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(aiter(provider)), 5)
        await pending.answer(pick("yes"), by="term")  # what it was doing, it finishes
    assert await asking == pick("yes")


async def test_an_unanswered_reservation_lapses(make_broker) -> None:
    page = await make_broker(lease_ttl=1.0)
    other = await make_broker(lease_ttl=1.0)
    await page.request_handover("web-1", by="alice", ttl=0.5)
    standing: list[str] = []
    assert await asyncio.wait_for(_take(other, "term", standing), 5) == "term"
    assert standing == ["web-1"]  # it waited for the page's reservation, then took the lease
