"""``broker.namespace_status``: a read-only snapshot of a namespace."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from msgspec.structs import replace

from broker import namespace_status
from broker._keys import Keys
from tests.helpers import one_question


async def test_an_idle_namespace(make_broker):
    broker = await make_broker()
    status = await namespace_status(broker)
    assert (status.holder, status.epoch, status.standbys, status.pending, status.agents) == (None, None, (), (), ())
    assert (status.stream_length, status.dead_letters, status.last_epoch) == (0, 0, 0)


async def test_holder_standby_pending_agents_and_dead_letters(make_broker, redis, namespace):
    holder_broker, standby_broker, asker = await make_broker(), await make_broker(), await make_broker()
    async with contextlib.AsyncExitStack() as stack:
        provider = await stack.enter_async_context(holder_broker.provider("desk"))
        announced = asyncio.Event()

        async def stand_by() -> None:
            async with standby_broker.provider("spare", on_standby=lambda _holder: announced.set()):
                pass

        waiting = asyncio.create_task(stand_by())
        stack.callback(waiting.cancel)
        await asyncio.wait_for(announced.wait(), 5)
        parent = await stack.enter_async_context(asker.agent("parent"))
        await stack.enter_async_context(asker.agent("child", owner=parent))
        asks = [
            asyncio.create_task(asker.ask(one_question(agent="parent"))),
            asyncio.create_task(asker.ask(replace(one_question(), priority="urgent"), coalesce=False)),
        ]
        for task in asks:
            stack.callback(task.cancel)
        delivered = [await asyncio.wait_for(anext(aiter(provider)), 5) for _ in asks]
        await redis.xadd(Keys(namespace).requests, {"kind": "garbage"})
        assert await redis.xread({Keys(namespace).dead: "0-0"}, block=5000)  # the reader dead-letters it

        status = await namespace_status(asker)

    assert (status.holder, status.epoch, status.last_epoch) == ("desk", provider.epoch, provider.epoch)
    assert status.lease_ttl_s is not None and 0 < status.lease_ttl_s <= holder_broker.lease_ttl
    assert status.standbys == ("spare",)
    assert {(p.request_id, p.agent, p.questions, p.delivered_epoch, p.priority) for p in status.pending} == {
        (d.request_id, d.agent_id, 1, provider.epoch, d.priority) for d in delivered
    }
    assert sorted(p.priority for p in status.pending) == ["normal", "urgent"]
    assert all(p.age_s >= 0 for p in status.pending)
    assert [(a.agent_id, a.owner) for a in status.agents] == [("child", "parent"), ("parent", None)]
    assert status.stream_length == 2 and status.dead_letters == 1


async def test_a_limit_lists_the_oldest_pending_and_agents_and_counts_them_all(make_broker, redis):
    broker = await make_broker()
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(broker.provider("desk"))
        for name in ("c", "a", "b"):
            await stack.enter_async_context(broker.agent(name))
        asked = []
        for priority in ("normal", "urgent", "normal", "low", "normal"):
            request = replace(one_question("yes", "no"), priority=priority)
            asked.append(asyncio.create_task(broker.ask(request, coalesce=False)))
            stack.callback(asked[-1].cancel)
            while len(await _pending_ids(redis, broker)) < len(asked):  # asked in this order, one after another
                await asyncio.sleep(0.01)
        order = await _pending_ids(redis, broker)

        limited = await namespace_status(broker, limit=2)
        everything = await namespace_status(broker)

    assert [p.request_id for p in limited.pending] == order[:2]  # the oldest two
    assert (limited.pending_count, limited.agent_count) == (5, 3)
    assert limited.pending_by_priority == {"urgent": 1, "normal": 3, "low": 1}
    assert [a.agent_id for a in limited.agents] == ["a", "b"]
    assert [p.request_id for p in everything.pending] == order and everything.pending_count == 5
    assert [a.agent_id for a in everything.agents] == ["a", "b", "c"]


@pytest.mark.parametrize("stream_page", [1000, 2], ids=["one-read", "across-reads"])
async def test_pages_after_a_cursor_list_every_pending_request_once_in_order(
    make_broker, redis, monkeypatch, stream_page
):
    """`qbroker status --limit N --after ENTRY`: page by page, each request once, oldest first, the counts
    always of all; the last page has no next cursor. ``stream_page`` small: a cursor falls mid-read."""
    import broker.operating.status

    monkeypatch.setattr(broker.operating.status, "_PAGE", stream_page)
    asking = await make_broker()
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(asking.provider("desk"))
        asked = []
        for _ in range(5):
            asked.append(asyncio.create_task(asking.ask(one_question("yes", "no"), coalesce=False)))
            stack.callback(asked[-1].cancel)
        while len(await _pending_ids(redis, asking)) < len(asked):
            await asyncio.sleep(0.01)
        order = await _pending_ids(redis, asking)
        pages, after = [], ""
        while True:
            page = await namespace_status(asking, limit=2, after=after)
            assert page.pending_count == 5
            pages.append([p.request_id for p in page.pending])
            if page.next_after is None:
                break
            assert page.next_after == page.pending[-1].entry
            after = page.next_after
    assert pages == [order[0:2], order[2:4], order[4:5]]


async def _pending_ids(redis, broker) -> list[str]:
    return [fields["rid"] for _, fields in await redis.xrange(broker.keys.requests)]
