"""One Redis user per role (broker/roles.py), against a real redis-server.

Everything works with each process on its own role's user; with the asker's user, every write
that issue 22's attacks 5, 8, 15, 16 and 17 made is refused. Each attack is first run with the
answerer's user, to show that it lands where the role allows it (so a renamed key cannot make
the refusal pass by itself).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

from broker import Remember
from broker.roles import ROLES, acl_rule, acl_user
from tests.helpers import SIGNING_KEY, next_pending, one_question, pick
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(30)

NS = "team-a"
P = "qb:{team-a}:"


@pytest.fixture
async def roles_server(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    return await start_roles_server(redis_factory)


async def start_roles_server(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    """A private server whose default user is off: one user per role of ``NS``, ``legacy`` and ``admin``."""
    server = redis_factory()
    admin = Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    try:
        # the rule every component shared before the roles (issue 22's attacks ran with it), and an operator
        legacy = "~qb:{team-a}:* -@all +@read +@write +@stream +@list +@hash +@string +@keyspace +evalsha +eval"
        await admin.execute_command("ACL", "SETUSER", "legacy", "reset", "on", ">pw-legacy", *legacy.split())
        await admin.execute_command("ACL", "SETUSER", "admin", "reset", "on", ">pw-admin", "~*", "&*", "+@all")
        for role in ROLES:
            await admin.execute_command(
                "ACL", "SETUSER", f"{NS}-{role}", "reset", "on", f">pw-{role}", *acl_rule(NS, role).split()
            )
        await admin.execute_command("ACL", "SETUSER", "default", "off")
    finally:
        await admin.aclose()
    return server


def url(server: RedisServer, role: str) -> str:
    return f"redis://{NS}-{role}:pw-{role}@127.0.0.1:{server.port}/0"


def client(server: RedisServer, role: str) -> Redis:
    """A connection as ``role``'s user (or as ``legacy`` or ``admin``)."""
    user = f"{NS}-{role}" if role in ROLES else role
    return Redis(host="127.0.0.1", port=server.port, username=user, password=f"pw-{role}", decode_responses=True)


def test_the_user_line_stores_the_password_hashed() -> None:
    line = acl_user(NS, "asker", "s3cret-password")
    assert line.startswith("user team-a-asker on #") and "s3cret-password" not in line
    assert "%R~qb:{team-a}:provider" in line and "~qb:{team-a}:*" not in line


async def test_every_role_does_its_work_on_its_own_user(roles_server, make_broker) -> None:
    asker = await make_broker(
        url=url(roles_server, "asker"), namespace=NS, signing_key=None, trusted_keys=[SIGNING_KEY.public_text]
    )
    answering = await make_broker(url=url(roles_server, "answerer"), namespace=NS)
    async with answering.provider("ui") as provider, asker.agent("builder") as agent:
        # a plain ask, remembered for the namespace; then the same question answered by the decision
        first = asyncio.create_task(agent.ask(one_question(), timeout=10))
        await (await next_pending(provider)).answer(pick("yes"), by="alice", remember=Remember())
        assert await first == pick("yes")
        assert await agent.ask(one_question(), timeout=10) == pick("yes")
        # a keyed ask, detached by cancelling it and re-attached
        keyed = asyncio.create_task(agent.ask(one_question("a", "b"), key="k1", timeout=10))
        pending = await next_pending(provider)
        keyed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await keyed
        again = asyncio.create_task(agent.ask(one_question("a", "b"), key="k1", timeout=10))
        await asyncio.sleep(0.3)
        await pending.answer(pick("b"), by="alice")
        assert await again == pick("b")
        # a withdrawn ask (timeout)
        with pytest.raises(Exception) as raised:
            await agent.ask(one_question("x", "y"), timeout=0.5)
        assert getattr(raised.value, "code", None) == "ASK_TIMED_OUT"
    assert asker.rejected_outcomes == 0


async def _refused(attempt: Callable[[Redis], Awaitable[Any]], server: RedisServer, lands_with: str) -> None:
    """The attack lands with another user (the answerer's, or the one all shared before), and is refused
    with the asker's."""
    permitted, asker = client(server, lands_with), client(server, "asker")
    try:
        await attempt(permitted)
        with pytest.raises(NoPermissionError):
            await attempt(asker)
    finally:
        await permitted.aclose()
        await asker.aclose()


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(lambda r: r.set(P + "provider", "1:forged:thief"), id="8-take-the-lease"),
        pytest.param(lambda r: r.set(P + "epoch", "1"), id="8-reset-the-epoch"),
        pytest.param(lambda r: r.zadd(P + "standbys", {"thief": 9e15}), id="8-fake-a-standby"),
        pytest.param(lambda r: r.set(P + "handover", "thief\nmallory", px=60_000), id="26-ask-for-a-handover"),
        pytest.param(lambda r: r.set(P + "lease-record", "0 1:forged:thief", px=60_000), id="8-keep-a-lease-lapsed"),
        pytest.param(lambda r: r.set(P + "web:public-url:web-1", "https://evil.example"), id="8-active-page-link"),
        pytest.param(
            lambda r: r.hset(P + "decision:ns:" + "0" * 64, mapping={"id": "forged", "selected": '["yes"]'}),
            id="5-plant-a-decision",
        ),
        pytest.param(lambda r: r.hset(P + "decisions", "forged", "x"), id="5-plant-into-the-index"),
        pytest.param(lambda r: r.hset(P + "web:session:abc", mapping={"user": "alice"}), id="15-forge-a-session"),
        pytest.param(lambda r: r.set(P + "web:throttle:user:alice", "1000"), id="16-lock-alice-out"),
        pytest.param(
            lambda r: r.xadd(P + "audit", {"event": "answered", "rid": "r1", "by": "alice"}), id="14-write-the-audit"
        ),
        pytest.param(
            lambda r: r.xadd(P + "audit", {"event": "answered", "rid": "r1", "by": "alice", "route": "[]"}),
            id="34-record-a-routed-cards-route-as-nobody-so-history-shows-it-to-all",
        ),
        pytest.param(lambda r: r.xtrim(P + "audit", maxlen=0), id="14-erase-the-audit"),
        pytest.param(lambda r: r.set(P + "audit:head", "1-0 forged"), id="14-move-the-audit-chain-head"),
        pytest.param(lambda r: r.xrange(P + "audit"), id="13-read-the-audit"),
        pytest.param(lambda r: r.xrange(P + "audit:human"), id="13-read-the-audits-human-record"),
        pytest.param(
            lambda r: r.xadd(P + "audit:human", {"event": "answered", "rid": "r1", "by": "alice"}),
            id="14-write-the-audits-human-record",
        ),
        pytest.param(lambda r: r.xtrim(P + "audit:human", maxlen=0), id="14-erase-the-audits-human-record"),
        pytest.param(lambda r: r.set(P + "audit:human:head", "1-0 forged"), id="14-move-the-human-records-head"),
        pytest.param(
            lambda r: r.set(P + "audit:automatic", "7"), id="14-keep-the-holders-decisions-out-of-the-human-record"
        ),
        pytest.param(
            lambda r: r.hset(P + "approvals:r1", mapping={"alice": '{"approving":true}', "bob": '{"approving":true}'}),
            id="25-forge-the-approvals-of-a-quorum",
        ),
        pytest.param(lambda r: r.hgetall(P + "approvals:r1"), id="25-read-who-approved"),
        pytest.param(lambda r: r.set(P + "slack:seen:" + "0" * 64, "1"), id="25-spend-a-slack-click"),
        pytest.param(lambda r: r.set(P + "maint:alive", "forged", px=60_000), id="26-feign-a-worker-so-nobody-reaps"),
        pytest.param(
            lambda r: r.set(P + "maint:reap-cursor", "99999999999999-0", px=600_000),
            id="27-move-the-housekeeping-cursor-past-every-request",
        ),
    ],
)
async def test_the_askers_user_cannot_write_what_only_answerers_may(roles_server, attack) -> None:
    await _refused(attack, roles_server, "answerer")


@pytest.mark.parametrize(
    ("attack", "lands_with"),
    [
        pytest.param(lambda r: r.execute_command("FUNCTION", "FLUSH"), "legacy", id="17-function-flush"),
        pytest.param(lambda r: r.execute_command("SCAN", 0), "admin", id="list-every-key"),
        pytest.param(lambda r: r.execute_command("KEYS", "*"), "admin", id="keys"),
    ],
)
async def test_no_role_may_flush_functions_or_list_keys(roles_server, attack, lands_with) -> None:
    await _refused(attack, roles_server, lands_with)
    for role in ("answerer", "maintenance"):
        other = client(roles_server, role)
        try:
            with pytest.raises(NoPermissionError):
                await attack(other)
        finally:
            await other.aclose()


async def test_the_asker_may_write_an_attachment(roles_server, make_broker) -> None:
    asker = await make_broker(
        url=url(roles_server, "asker"), namespace=NS, signing_key=None, trusted_keys=[SIGNING_KEY.public_text]
    )
    answering = await make_broker(url=url(roles_server, "answerer"), namespace=NS)
    digest = await asker.attach("the whole arguments")
    assert await answering.attachment(digest) == "the whole arguments"


async def test_the_asker_may_still_read_the_lease_and_the_decisions(roles_server) -> None:
    asker = client(roles_server, "asker")
    try:
        assert await asker.exists(P + "provider") == 0
        assert await asker.hgetall(P + "decision:ns:" + "0" * 64) == {}  # type: ignore[misc]  # redis-py types async replies as T | Awaitable[T]
        with pytest.raises(NoPermissionError):
            await asker.get(P + "web:session:abc")  # the web's keys are not even readable
    finally:
        await asker.aclose()
