"""History is routed like the live page (issue 34, docs/approvals.md), over real HTTP, Redis and web processes.

The answering side records each settled card's route in its audit entry; History shows a card to those who
could see it pending, on the server that showed it and on one that never did (a standby: the audit alone). A
route an asker writes into its own log is not trusted, and a late click on a card routed elsewhere is not told
how it was settled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest, Broker
from broker._keys import Keys
from tests.helpers import KEYS
from tests.redis_server import RedisServer
from tests.web.conftest import WebProcess, write_users_file
from tests.web.test_api import eventually, read_events, signed_in

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

POLICY = """
[[policy]]
name = "billing"
match = { header = "Billing" }
route = "sre"
"""
ROUTED, OPEN = "Refund invoice 12?", "Rename the repo?"


@pytest.fixture
def webs(redis_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[list[WebProcess]]:
    """A holder and a standby of one namespace, with the routing policy; alice is in sre, bob is not."""
    users = write_users_file(tmp_path / "users.toml")
    users.write_text(users.read_text() + '[groups]\nsre = ["alice"]\n')
    (tmp_path / "policy.toml").write_text(POLICY)
    extra = ["--policy-file", str(tmp_path / "policy.toml"), "--handover-grace", "1"]  # a take-over within 2 s
    started = [WebProcess(redis_server.url, namespace, users, tmp_path / "web-1.log", extra=extra).start()]
    try:
        started.append(
            WebProcess(redis_server.url, namespace, users, tmp_path / "web-2.log", name="web-2", extra=extra).start()
        )
        yield started
    finally:
        for web in started:
            web.stop()


def _request(text: str, header: str) -> AskUserQuestionRequest:
    options = (AskUserQuestionOption(label="Yes"), AskUserQuestionOption(label="No"))
    return AskUserQuestionRequest(
        questions=(AskUserQuestionItem(id="q1", question=text, header=header, options=options),)
    )


async def _answer(client: httpx.AsyncClient, text: str) -> str:
    """Answer the pending card asking ``text``; its id."""

    async def card() -> str | None:
        requests = (await client.get("/api/requests")).json()["requests"]
        return next((r["id"] for r in requests if r["questions"][0]["question"] == text), None)

    request_id: str = await eventually(card, f"{text} shows up")
    body = {"answers": [{"id": "q1", "selected": ["Yes"]}]}
    response = await client.post(f"/api/requests/{request_id}/answer", json=body)
    assert response.status_code == 200, response.text
    return request_id


async def _history(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """History by request id (the newest entry of each)."""
    entries = (await client.get("/api/history")).json()["entries"]
    return {entry["id"]: entry for entry in reversed(entries)}


def _texts(entry: dict[str, Any]) -> list[Any]:
    return [question["question"] for question in entry["questions"]]


async def test_history_shows_a_routed_card_to_its_group_only_from_what_the_audit_recorded(
    webs: list[WebProcess], redis: Redis
) -> None:
    holder, standby = webs
    async with Broker(holder.redis_url, holder.namespace, **KEYS) as asker:
        asks = [
            asyncio.create_task(asker.ask(_request(t, h), timeout=30))
            for t, h in ((ROUTED, "Billing"), (OPEN, "Chores"))
        ]
        async with signed_in(holder, "alice") as alice:
            routed, unrouted = await _answer(alice, ROUTED), await _answer(alice, OPEN)
        await asyncio.gather(*asks)
    audit = {f["rid"]: f for _, f in await redis.xrange(Keys(holder.namespace).audit) if f["event"] == "answered"}
    assert (json.loads(audit[routed]["route"]), json.loads(audit[unrouted]["route"])) == (["sre"], [])

    # The holder (which showed the cards) and the standby (which never did: the audit alone) alike.
    for web in (holder, standby):
        async with signed_in(web, "alice") as alice, signed_in(web, "bob") as bob:
            alices, bobs = await _history(alice), await _history(bob)
        assert _texts(alices[routed]) == [ROUTED] and alices[routed]["by"] == "alice", web.name
        assert _texts(bobs[unrouted]) == [OPEN] and not bobs[unrouted].get("hidden"), web.name
        assert routed not in bobs, f"{web.name}'s History showed bob (not in sre) a card routed to sre"


async def test_a_route_an_asker_writes_into_its_log_is_not_trusted(webs: list[WebProcess], redis: Redis) -> None:
    """The asker's log is the asker's to write: a settlement forged there, routed to nobody, lands in History
    (the attack fires) but its route is ignored: bob, outside sre, is shown neither the question nor who answered."""
    holder, standby = webs
    async with Broker(holder.redis_url, holder.namespace, **KEYS) as asker:
        asked = asyncio.create_task(asker.ask(_request(ROUTED, "Billing"), timeout=30))
        async with signed_in(holder, "alice") as alice:
            routed = await _answer(alice, ROUTED)
        await asked
        # What the asker's own credentials may write: its log (tests/test_roles.py; the audit refuses them).
        forged = {"event": "answered", "rid": routed, "by": "alice", "route": "[]"}
        await asker.commands.call("XADD", asker.keys.asklog, "*", *[x for pair in forged.items() for x in pair])
    async with signed_in(standby, "alice") as alice, signed_in(standby, "bob") as bob:
        alices = (await alice.get("/api/history")).json()["entries"]
        bobs = (await bob.get("/api/history")).json()["entries"]
    assert any(e["id"] == routed and e["source"] == "asker" and e["by"] == "alice" for e in alices), alices
    shown = [e for e in bobs if e["id"] == routed]
    assert shown and all(e["source"] == "asker" and e["hidden"] for e in shown), shown  # only the forged entry
    assert ROUTED not in json.dumps(bobs) and "alice" not in json.dumps(bobs), bobs


async def test_a_late_click_on_a_card_routed_elsewhere_is_not_told_how_it_was_settled(webs: list[WebProcess]) -> None:
    holder, _ = webs
    async with Broker(holder.redis_url, holder.namespace, **KEYS) as asker:
        asked = asyncio.create_task(asker.ask(_request(ROUTED, "Billing"), timeout=30))
        async with signed_in(holder, "alice") as alice, signed_in(holder, "bob") as bob:
            routed = await _answer(alice, ROUTED)
            await asked
            body = {"answers": [{"id": "q1", "selected": ["No"]}]}
            late = (await bob.post(f"/api/requests/{routed}/answer", json=body)).json()
            told = (await alice.post(f"/api/requests/{routed}/answer", json=body)).json()
    assert late["code"] == "NOT_PENDING" and "winner" not in late and "alice" not in json.dumps(late), late
    assert told["winner"]["by"] == "alice", told  # a member is told who was first


@asynccontextmanager
async def _stream(client: httpx.AsyncClient) -> AsyncIterator[list[dict[str, Any]]]:
    """The change stream's events as they come (read by a task of its own while the block runs)."""
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async with client.stream("GET", "/api/events", timeout=None) as response:
            async for kind, data in read_events(response):
                seen.append({"event": kind, **data})

    reading = asyncio.create_task(read())
    try:
        await eventually(lambda: _has(seen, "snapshot"), "the stream's snapshot")
        yield seen
    finally:
        reading.cancel()


_ADDED = ("added", "addedMany")


async def _has(seen: list[dict[str, Any]], kind: str | tuple[str, ...], **fields: Any) -> bool:
    kinds = (kind,) if isinstance(kind, str) else kind
    return any(e["event"] in kinds and all(e.get(k) == v for k, v in fields.items()) for e in seen)


async def _take_over(client: httpx.AsyncClient) -> None:
    """Ask the holder to hand the lease to ``client``'s server, and wait until it serves."""
    response = await client.post("/api/takeover", json={})
    assert response.status_code == 200, response.text

    async def serving() -> bool:
        return bool((await client.get("/api/requests")).json()["status"] == "active")

    await eventually(serving, "the take-over")


async def test_a_lost_cards_follow_up_goes_only_to_the_pages_the_card_went_to(webs: list[WebProcess]) -> None:
    """web-1 shows a card routed to sre and loses the lease (a take-over); web-2 serves and alice answers there;
    web-1 serves again and follows the lost card up (removed, how it was settled): to alice's stream, not bob's.
    The card is gone from web-1's live routes by then: the follow-up is routed as the card was shown."""
    first, second = webs
    async with (
        Broker(first.redis_url, first.namespace, **KEYS) as asker,
        signed_in(first, "alice") as alice,
        signed_in(first, "bob") as bob,
        signed_in(second, "alice") as alice_on_second,
        _stream(alice) as alices,
        _stream(bob) as bobs,
    ):
        asked = asyncio.create_task(asker.ask(_request(ROUTED, "Billing"), timeout=30))
        await eventually(lambda: _has(alices, _ADDED), "the routed card on alice's page")
        routed = next((e.get("request") or e["requests"][0])["id"] for e in alices if e["event"] in _ADDED)
        await _take_over(alice_on_second)
        await eventually(lambda: _has(alices, "removed", id=routed, reason="lost"), "taken down on web-1")
        assert await _answer(alice_on_second, ROUTED) == routed
        await asked
        await _take_over(alice)  # web-1 serves again and follows its lost card up
        await eventually(lambda: _has(alices, "removed", id=routed, reason="answered"), "alice is told")
        opened = asyncio.create_task(asker.ask(_request(OPEN, "Chores"), timeout=30))
        # Every page is sent this one: once bob's stream has it, the follow-up before it was sent or left out.
        await eventually(lambda: _has(bobs, _ADDED), "the unrouted card on bob's page")
        opened.cancel()
    assert not [e for e in bobs if routed in json.dumps(e)], f"bob (not in sre) was sent {routed}: {bobs}"
    followed_up = [e for e in alices if e["event"] == "removed" and e["id"] == routed and e["reason"] == "answered"]
    assert followed_up[0]["by"] == "alice" and followed_up[0].get("routes") == ["sre"], followed_up


async def _settled_in_the_audit(redis: Redis, namespace: str, count: int, route: list[str], tag: str) -> None:
    """``count`` settlements routed to ``route`` as the answering side records them (the audit's ``route``), an ask
    in the askers' log between every ten (History reads both streams, each a page at a time)."""
    keys = Keys(namespace)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(count):
            rid = f"{tag}-{i}"
            pipe.xadd(keys.audit, {"event": "answered", "rid": rid, "by": "alice", "route": json.dumps(route)})
            if i % 10 == 0:
                pipe.xadd(keys.asklog, {"event": "asked", "rid": rid})
        await pipe.execute()


async def test_history_fills_a_page_with_what_its_person_may_see_reading_at_most_its_bound(
    webs: list[WebProcess], redis: Redis
) -> None:
    """The page of History a person gets holds up to ``limit`` entries they may see, read on past the newer ones
    routed away from them, though no further than 4 000 events (``READ_BOUND``, docs/approvals.md)."""
    holder, _ = webs
    await _settled_in_the_audit(redis, holder.namespace, 1, [], "open")
    await _settled_in_the_audit(redis, holder.namespace, 2_000, ["sre"], "sre")  # 2 200 events with their asks
    async with signed_in(holder, "bob") as bob, signed_in(holder, "alice") as alice:
        bobs = (await bob.get("/api/history", params={"limit": 1})).json()
        alices = (await alice.get("/api/history", params={"limit": 2})).json()
        assert [e["id"] for e in bobs["entries"]] == ["open-0"], bobs  # found behind 2 000 of another group's
        assert [e["id"] for e in alices["entries"]] == ["sre-1999", "sre-1998"], alices
        assert not bobs["truncated"] and not alices["truncated"]
        await _settled_in_the_audit(redis, holder.namespace, 2_000, ["sre"], "more")  # 4 400: past the bound
        bobs = (await bob.get("/api/history", params={"limit": 1})).json()
        assert bobs["entries"] == [], bobs  # the one bob may see is further back than one request reads
        assert bobs["truncated"], bobs  # and the reply says its search stopped short, not that nothing is there
        everything = (await bob.get("/api/history", params={"limit": 200})).json()
        assert everything["entries"] == [] and everything["truncated"], everything
