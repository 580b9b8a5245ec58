"""The JSON API and the change stream of ``python -m workers.answering.web``, over real HTTP and Redis."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, Broker, UserQuestionError
from broker._keys import Keys
from tests.helpers import KEYS, one_question, question
from tests.redis_server import RedisServer
from tests.web.conftest import PASSWORDS, TOKEN, WebProcess, write_users_file

pytestmark = pytest.mark.slow

BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def eventually(check: Callable[[], Coroutine[Any, Any, Any]], what: str) -> Any:
    """Poll ``check`` until it returns something truthy (a test's wait, not a measurement)."""
    async with asyncio.timeout(10):
        while True:
            result = await check()
            if result:
                return result
            await asyncio.sleep(0.05)
    raise AssertionError(what)  # pragma: no cover


async def pending_ids(client: httpx.AsyncClient, **kwargs: Any) -> list[str]:
    response = await client.get("/api/requests", **kwargs)
    assert response.status_code == 200, response.text
    return [r["id"] for r in response.json()["requests"]]


async def wait_request(client: httpx.AsyncClient) -> dict[str, Any]:
    async def first() -> dict[str, Any] | None:
        requests = (await client.get("/api/requests", headers=BEARER)).json()["requests"]
        return requests[0] if requests else None

    request: dict[str, Any] = await eventually(first, "a request shows up")
    return request


@asynccontextmanager
async def signed_in(web: WebProcess, user: str = "alice") -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=web.url) as client:
        response = await client.post("/api/session", json={"user": user, "password": PASSWORDS[user]})
        assert response.status_code == 200, response.text
        client.headers["X-CSRF-Token"] = response.json()["csrf"]
        yield client


@pytest.fixture
async def client(start_web: Callable[..., WebProcess]) -> AsyncIterator[httpx.AsyncClient]:
    web = start_web()
    async with httpx.AsyncClient(base_url=web.url) as client:
        yield client


@pytest.fixture
async def alice_and_bob(
    start_web: Callable[..., WebProcess],
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Alice and Bob signed in to one web server."""
    web = start_web()
    async with signed_in(web, "alice") as alice, signed_in(web, "bob") as bob:
        yield alice, bob


def asking(broker: Broker, request: AskUserQuestionRequest) -> asyncio.Task[AskUserQuestionAnswer]:
    return asyncio.create_task(broker.ask(request, abort=None, timeout=30))


async def asked_and_listed(
    asker: Broker, client: httpx.AsyncClient
) -> tuple[asyncio.Task[AskUserQuestionAnswer], dict[str, Any], str]:
    """A yes/no question of ``asker``, listed to ``client``: the ask's task, the request as listed, its answer URL."""
    asked = asking(asker, one_question("yes", "no"))
    request = await wait_request(client)
    return asked, request, f"/api/requests/{request['id']}/answer"


async def test_nothing_without_signing_in(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/api/requests"),
        ("GET", "/api/events"),
        ("POST", "/api/requests/x/answer"),
        ("POST", "/api/requests/x/cancel"),
    ]:
        response = await client.request(method, path, json={"answers": []})
        assert response.status_code == 401, (method, path)
        assert response.json() == {"name": "WebError", "code": "UNAUTHENTICATED", "message": "sign in first"}
    bad = await client.get("/api/requests", headers={"Authorization": "Bearer not-a-token"})
    assert bad.status_code == 401
    forged = await client.get("/api/requests", headers={"Cookie": "qb_session=eyJ1IjoiYWxpY2UiLCJjIjoieCJ9.forged.sig"})
    assert forged.status_code == 401


@pytest.mark.parametrize(
    "body",
    [{"user": "alice", "password": "wrong"}, {"user": "mallory", "password": "x"}, {"token": "nope"}],
    ids=["wrong-password", "unknown-user", "unknown-token"],
)
async def test_sign_in_refused(client: httpx.AsyncClient, body: dict[str, str]) -> None:
    response = await client.post("/api/session", json=body)
    assert response.status_code == 401
    assert "qb_session" not in response.cookies


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "type your user name and password (or a token)"),
        ({"user": "", "password": "", "token": ""}, "type your user name and password (or a token)"),
        ({"user": "alice", "password": ""}, "type your password"),
        ({"user": "mallory", "password": ""}, "type your password"),
        ({"user": " ", "password": "alice-password"}, "type your user name"),
        ({"password": "alice-password"}, "type your user name"),
    ],
    ids=["nothing", "all-empty", "known-user-no-password", "unknown-user-no-password", "blank-user", "no-user"],
)
async def test_an_empty_sign_in_says_what_is_missing(
    client: httpx.AsyncClient, body: dict[str, str], says: str
) -> None:
    """Issue "The page a team trusts at fleet size", row 7: an empty sign-in said 'wrong user name, password
    or token'. What is missing is said from the fields alone, so a known and an unknown name read the same."""
    response = await client.post("/api/session", json=body)
    assert response.status_code == 400, response.text
    assert response.json() == {"name": "WebError", "code": "MISSING_CREDENTIALS", "message": says}
    assert "qb_session" not in response.cookies


async def test_session_cookie_is_strict_and_http_only(client: httpx.AsyncClient) -> None:
    response = await client.post("/api/session", json={"token": TOKEN})
    assert response.status_code == 200
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    session = await client.get("/api/session")
    assert session.json()["user"] == "ci-bot"


async def test_csrf_is_required_with_a_session(
    start_web: Callable[..., WebProcess], make_broker: Callable[..., Any]
) -> None:
    web = start_web()
    async with signed_in(web) as client:
        asked, _request, url = await asked_and_listed(await make_broker(), client)
        body = {"answers": [{"id": "q1", "selected": ["yes"]}]}
        no_token = await client.post(url, json=body, headers={"X-CSRF-Token": ""})
        assert no_token.status_code == 403 and no_token.json()["code"] == "CSRF"
        wrong = await client.post(url, json=body, headers={"X-CSRF-Token": "guess"})
        assert wrong.status_code == 403
        cross_site = await client.post(url, json=body, headers={"Sec-Fetch-Site": "cross-site"})
        assert cross_site.status_code == 403
        other_origin = await client.post(url, json=body, headers={"Origin": "https://evil.example"})
        assert other_origin.status_code == 403
        login_cross_site = await client.post(
            "/api/session", json={"token": TOKEN}, headers={"Origin": "https://evil.example"}
        )
        assert login_cross_site.status_code == 403
        assert not asked.done()
        ok = await client.post(url, json=body)
        assert ok.status_code == 200, ok.text
    assert (await asked).answers[0].selected == ("yes",)


async def test_answer_with_a_token_is_audited(
    client: httpx.AsyncClient, make_broker: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    asked, request, _ = await asked_and_listed(await make_broker(), client)
    assert request["questions"][0]["options"] == [
        {"label": "yes", "text": "yes", "description": None},
        {"label": "no", "text": "no", "description": None},
    ]
    response = await client.post(
        f"/api/requests/{request['id']}/answer",
        json={"answers": [{"id": "q1", "selected": ["no"]}]},
        headers=BEARER,
    )
    assert response.status_code == 200, response.text
    assert response.json()["by"] == "ci-bot"
    assert (await asked).answers[0].selected == ("no",)
    entries = await redis.xrange(Keys(namespace).audit)
    answered = [fields for _id, fields in entries if fields.get("event") == "answered"]
    assert [e["by"] for e in answered] == ["ci-bot"]
    assert await pending_ids(client, headers=BEARER) == []


async def test_refusals_carry_code_and_status(
    alice_and_bob: tuple[httpx.AsyncClient, httpx.AsyncClient], make_broker: Callable[..., Any]
) -> None:
    alice, bob = alice_and_bob
    asked, request, url = await asked_and_listed(await make_broker(), alice)
    bad = await alice.post(url, json={"answers": [{"id": "q1", "selected": ["maybe"]}]})
    assert bad.status_code == 422 and bad.json()["code"] == "BAD_ANSWER"
    malformed = await alice.post(url, json={"answers": "nope"})
    assert malformed.status_code == 422 and malformed.json()["code"] == "BAD_ANSWER"
    assert await pending_ids(alice) == [request["id"]]  # still pending after a refusal
    first = await alice.post(url, json={"answers": [{"id": "q1", "selected": ["yes"]}]})
    assert first.status_code == 200
    second = await bob.post(url, json={"answers": [{"id": "q1", "selected": ["no"]}]})
    assert second.status_code == 409
    assert second.json() == {
        "name": "UserQuestionError",
        "code": "NOT_PENDING",
        "message": f"request {request['id']} was already answered by alice",
        "winner": {"state": "answered", "by": "alice", "answer": {"answers": [{"id": "q1", "selected": ["yes"]}]}},
    }
    unknown = await bob.post("/api/requests/nope/cancel", json={})
    assert unknown.status_code == 409 and unknown.json()["code"] == "NOT_PENDING"
    assert (await asked).answers[0].selected == ("yes",)


async def test_racing_answers_have_one_winner(
    alice_and_bob: tuple[httpx.AsyncClient, httpx.AsyncClient], make_broker: Callable[..., Any]
) -> None:
    alice, bob = alice_and_bob
    asked, _request, url = await asked_and_listed(await make_broker(), alice)
    replies = await asyncio.gather(
        alice.post(url, json={"answers": [{"id": "q1", "selected": ["yes"]}]}),
        bob.post(url, json={"answers": [{"id": "q1", "selected": ["no"]}]}),
    )
    statuses = sorted(r.status_code for r in replies)
    assert statuses == [200, 409]
    winner = next(r for r in replies if r.status_code == 200).json()["by"]
    loser = next(r for r in replies if r.status_code == 409).json()
    assert loser["message"].endswith(f"already answered by {winner}")
    assert (await asked).answers[0].selected == (("yes",) if winner == "alice" else ("no",))


async def test_cancel_reaches_the_asker(client: httpx.AsyncClient, make_broker: Callable[..., Any]) -> None:
    asker = await make_broker()
    asked = asking(asker, AskUserQuestionRequest(questions=(question("a", "x"), question("b"))))
    request = await wait_request(client)
    response = await client.post(f"/api/requests/{request['id']}/cancel", json={"message": "not now"}, headers=BEARER)
    assert response.status_code == 200
    with pytest.raises(UserQuestionError) as caught:
        await asked
    assert caught.value.code == "ASK_CANCELLED"


async def read_events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    kind = ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield kind, json.loads(line.removeprefix("data: "))


async def test_events_stream_added_and_withdrawn(client: httpx.AsyncClient, make_broker: Callable[..., Any]) -> None:
    asker = await make_broker()
    async with asyncio.timeout(20), client.stream("GET", "/api/events", headers=BEARER) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_events(response)
        kind, snapshot = await anext(events)
        assert kind == "snapshot" and snapshot["requests"] == [] and snapshot["status"]["status"] == "active"
        asked = asking(asker, one_question("yes", "no"))
        kind, added = await anext(events)
        assert kind == "added"
        asked.cancel()  # the asker withdraws
        kind, removed = await anext(events)
        assert (kind, removed) == (
            "removed",
            {
                "type": "removed",
                "id": added["request"]["id"],
                "reason": "withdrawn",
                "by": "",
                "settled": None,
                "namespace": added["request"]["namespace"],
                "total": 0,  # how many this page may see now (it shows "N more waiting" beyond its window)
            },
        )


async def test_standby_then_takeover(start_web: Callable[..., WebProcess], make_broker: Callable[..., Any]) -> None:
    first = start_web("web-1")
    second = start_web("web-2")
    async with httpx.AsyncClient(base_url=second.url, headers=BEARER) as client:
        status = (await client.get("/api/requests")).json()
        assert (status["status"], status["holder"]) == ("standby", "web-1")
        asker = await make_broker()
        asked = asking(asker, one_question("yes", "no"))
        async with httpx.AsyncClient(base_url=first.url, headers=BEARER) as first_client:
            request = await wait_request(first_client)
        refused = await client.post(
            f"/api/requests/{request['id']}/answer", json={"answers": [{"id": "q1", "selected": ["yes"]}]}
        )
        assert refused.status_code == 503 and refused.json()["code"] == "LEASE_LOST"  # a standby takes none
        first.stop()
        taken = await wait_request(client)  # redelivered to the new holder
        assert taken["id"] == request["id"]
        response = await client.post(
            f"/api/requests/{request['id']}/answer", json={"answers": [{"id": "q1", "selected": ["yes"]}]}
        )
        assert response.status_code == 200, response.text
    assert (await asked).answers[0].selected == ("yes",)


async def test_fenced_provider_refuses_and_stands_by(
    client: httpx.AsyncClient, make_broker: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    asked, request, _ = await asked_and_listed(await make_broker(), client)
    # Another holder takes the lease behind the web provider's back (a stall, a partition).
    await redis.set(Keys(namespace).provider, "99:intruder-token:intruder", px=30_000)

    async def standing_by() -> bool:
        body = (await client.get("/api/requests", headers=BEARER)).json()
        return bool(body["status"] == "standby" and body["holder"] == "intruder")

    await eventually(standing_by, "the fenced web provider stands by")
    metrics = (await client.get("/metrics", headers=BEARER)).text
    assert f'qbroker_lease_losses_total{{namespace="{namespace}"}} 1.0' in metrics
    assert await pending_ids(client, headers=BEARER) == []
    response = await client.post(
        f"/api/requests/{request['id']}/answer",
        json={"answers": [{"id": "q1", "selected": ["yes"]}]},
        headers=BEARER,
    )
    assert response.status_code == 503
    assert response.json()["code"] == "LEASE_LOST"
    assert not asked.done()
    asked.cancel()


async def test_page_has_a_strict_policy_and_no_inline_script(client: httpx.AsyncClient) -> None:
    page = await client.get("/")
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy
    assert "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    html = page.text
    assert html.count("<script") == html.count('<script src="/static/') == 1
    assert not re.search(r"\son[a-z]+\s*=", html)  # no inline handlers
    script = await client.get("/static/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]


async def test_serves_again_after_redis_comes_back(
    redis_factory: Callable[..., RedisServer], namespace: str, tmp_path: Path
) -> None:
    server = redis_factory()
    web = WebProcess(server.url, namespace, write_users_file(tmp_path / "u.toml"), tmp_path / "web.log").start()
    try:
        async with httpx.AsyncClient(base_url=web.url, headers=BEARER) as client:

            async def status_is(wanted: str) -> bool:
                response = await client.get("/api/requests")
                if response.status_code == 503:  # sessions and throttles live in Redis: a coded 503
                    assert response.json()["code"] == "BROKER_UNAVAILABLE"
                    return wanted == "connecting"
                return bool(response.json()["status"] == wanted)

            assert await status_is("active")
            server.kill()
            await eventually(lambda: status_is("connecting"), "the web provider notices Redis is gone")
            server.start()
            await eventually(lambda: status_is("active"), "the web provider serves again")
            # The restarted Redis kept nothing: a provider that never noticed the outage holds no lease
            # there until its next renewal fails and it takes the lease again. Ask once it is held.
            async with Redis.from_url(server.url, decode_responses=True) as redis:
                await eventually(lambda: redis.exists(Keys(namespace).provider), "the lease is held again")
            async with Broker(server.url, namespace, **KEYS) as asker:
                asked = asking(asker, one_question("yes", "no"))
                request = await wait_request(client)
                response = await client.post(
                    f"/api/requests/{request['id']}/answer", json={"answers": [{"id": "q1", "selected": ["no"]}]}
                )
                assert response.status_code == 200, response.text
                assert (await asked).answers[0].selected == ("no",)
    finally:
        web.stop()


async def test_metrics_need_a_token_and_count_leases_and_sign_ins(
    start_web: Callable[..., WebProcess], namespace: str
) -> None:
    web = start_web()
    async with httpx.AsyncClient(base_url=web.url) as client:
        assert (await client.get("/metrics")).status_code == 401
        await client.post("/api/session", json={"user": "alice", "password": "wrong"})
        await client.post("/api/session", json={"user": "alice", "password": PASSWORDS["alice"]})
        response = await client.get("/metrics", headers=BEARER)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert f'qbroker_lease_acquisitions_total{{namespace="{namespace}"}} 1.0' in text
    assert f'qbroker_web_sign_ins_total{{namespace="{namespace}",result="ok"}} 1.0' in text
    assert f'qbroker_web_sign_ins_total{{namespace="{namespace}",result="refused"}} 1.0' in text


async def test_one_server_serves_several_namespaces_by_user(
    start_web: Callable[..., WebProcess], make_broker: Callable[..., Any], namespace: str, tmp_path: Path
) -> None:
    other = namespace + "-b"
    users = write_users_file(tmp_path / "multi.toml")
    users.write_text(users.read_text() + f'[namespaces]\nalice = ["{namespace}", "{other}"]\nbob = ["{other}"]\n')
    base = start_web("web-1", "--serve", other)
    base.stop()
    web = WebProcess(base.redis_url, namespace, users, tmp_path / "multi.log", extra=["--serve", other]).start()
    try:
        home, away = await make_broker(), await make_broker(namespace=other)
        asked_home = asking(home, one_question("yes", "no"))
        asked_away = asking(away, one_question("left", "right"))
        async with signed_in(web, "alice") as alice, signed_in(web, "bob") as bob:
            assert (await alice.get("/api/session")).json()["namespaces"] == [namespace, other]
            assert (await bob.get("/api/session")).json()["namespaces"] == [other]

            async def both() -> list[dict[str, Any]] | None:
                requests: list[dict[str, Any]] = (await alice.get("/api/requests")).json()["requests"]
                return requests if len(requests) == 2 else None

            requests = {r["namespace"]: r for r in await eventually(both, "alice sees both namespaces")}
            seen_by_bob = (await bob.get("/api/requests")).json()
            assert [r["namespace"] for r in seen_by_bob["requests"]] == [other]
            assert set(seen_by_bob["namespaces"]) == {other}
            home_id, away_id = requests[namespace]["id"], requests[other]["id"]
            refused = await bob.post(
                f"/api/requests/{home_id}/answer", json={"answers": [{"id": "q1", "selected": ["yes"]}]}
            )
            assert refused.status_code == 409 and refused.json()["code"] == "NOT_PENDING"  # not his namespace
            ok = await bob.post(
                f"/api/requests/{away_id}/answer", json={"answers": [{"id": "q1", "selected": ["left"]}]}
            )
            assert ok.status_code == 200, ok.text
            ok = await alice.post(
                f"/api/requests/{home_id}/answer", json={"answers": [{"id": "q1", "selected": ["no"]}]}
            )
            assert ok.status_code == 200, ok.text
            history = (await alice.get("/api/history")).json()["entries"]
            assert {(e["namespace"], e["by"]) for e in history} == {(namespace, "alice"), (other, "bob")}
            assert [e["namespace"] for e in (await bob.get("/api/history")).json()["entries"]] == [other]
            health = (await alice.get("/healthz")).json()
        assert (await asked_home).answers[0].selected == ("no",)
        assert (await asked_away).answers[0].selected == ("left",)
        assert health["namespaces"] == {n: {"status": "active", "holder": "web-1"} for n in (namespace, other)}
        assert health["redis"] == "ok"
    finally:
        web.stop()


async def test_a_late_answer_on_another_server_learns_the_winner(
    start_web: Callable[..., WebProcess], make_broker: Callable[..., Any]
) -> None:
    first = start_web("web-1")
    async with signed_in(first, "alice") as alice:
        asked, request, url = await asked_and_listed(await make_broker(), alice)
        assert (
            await alice.post(url, json={"answers": [{"id": "q1", "selected": [], "custom": "alice's words"}]})
        ).status_code == 200
    assert (await asked).answers[0].custom == "alice's words"  # the asker has it: its request hash is gone
    first.stop()
    second = start_web("web-2")
    async with signed_in(second, "bob") as bob:
        late = await bob.post(url, json={"answers": [{"id": "q1", "selected": ["no"]}]})
    assert late.status_code == 409
    body = late.json()
    assert body["message"] == f"request {request['id']} was already answered by alice"
    assert body["winner"] == {
        "state": "answered",
        "by": "alice",
        "answer": {"answers": [{"id": "q1", "selected": [], "custom": "alice's words"}]},
    }


async def test_remembered_decisions_over_the_api(
    start_web: Callable[..., WebProcess], make_broker: Callable[..., Any], redis: Redis, namespace: str
) -> None:
    web = start_web()
    asker = await make_broker()
    async with signed_in(web) as client:
        for method, path in [("GET", "/api/decisions"), ("POST", "/api/decisions/x/revoke")]:
            async with httpx.AsyncClient(base_url=web.url) as anonymous:
                assert (await anonymous.request(method, path, json={})).status_code == 401, path
        asked = asking(asker, one_question("yes", "no"))
        request = await wait_request(client)
        assert request["remember"] == ["namespace"]  # agentless: no agent scope
        url = f"/api/requests/{request['id']}/answer"
        body: dict[str, Any] = {"answers": [{"id": "q1", "selected": ["yes"]}]}
        for bad in [{"scope": "fleet"}, {"scope": "agent"}, {"scope": "namespace", "ttl": "long"}, "yes"]:
            refused = await client.post(url, json={**body, "remember": bad})
            assert refused.status_code in (400, 422), (bad, refused.text)
            assert refused.json()["code"] in ("BAD_REQUEST", "BAD_ANSWER"), refused.text
        answered = await client.post(url, json={**body, "remember": {"scope": "namespace", "ttl": 120}})
        assert answered.status_code == 200 and answered.json()["remembered"] is True, answered.text
        assert (await asked).answers[0].selected == ("yes",)

        listed = (await client.get("/api/decisions")).json()
        [decision] = listed["decisions"]
        assert (decision["by"], decision["provider"], decision["namespace"]) == ("alice", "web-1", namespace)
        assert decision["expiresMs"] - decision["atMs"] == 120_000 and listed["nowMs"] >= decision["atMs"]

        revoke = f"/api/decisions/{decision['id']}/revoke"
        assert (await client.post(revoke, json={}, headers={"X-CSRF-Token": "guess"})).status_code == 403
        assert (await asker.decisions()) != []
        assert (await client.post(revoke, json={})).status_code == 200
        again = await client.post(revoke, json={})
        assert again.status_code == 404 and again.json()["code"] == "NOT_FOUND"
        assert (await client.get("/api/decisions")).json()["decisions"] == []
    [forgotten] = [f for _, f in await redis.xrange(Keys(namespace).audit) if f["event"] == "forgotten"]
    assert forgotten["by"] == "alice"


@pytest.mark.timeout(45)
async def test_history_says_what_happened(start_web: Callable[..., WebProcess], make_broker: Any) -> None:
    """Issue 26, item 7: a remembered answer, a coalesced card's second asker and a declined plan in History."""
    from tests.helpers import plan_review

    web = start_web()
    one, two = await make_broker(), await make_broker()
    async with signed_in(web) as alice, one.agent("builder") as builder, two.agent("tester") as tester:
        asked = asyncio.create_task(builder.ask(one_question("yes", "no"), timeout=30))
        also = asyncio.create_task(tester.ask(one_question("yes", "no"), timeout=30))
        card = await wait_request(alice)
        await eventually(lambda: _askers_of(alice, card["id"], 2), "the second asker joins the card")
        body = {"answers": [{"id": "q1", "selected": ["yes"]}], "remember": {"scope": "namespace"}}
        assert (await alice.post(f"/api/requests/{card['id']}/answer", json=body)).status_code == 200
        await asyncio.gather(asked, also)
        assert (await builder.ask(one_question("yes", "no"), timeout=30)).answers[0].selected == ("yes",)
        declined = asyncio.create_task(one.ask(plan_review("Approve", "Approve", "Decline"), timeout=30))
        plan = await wait_request(alice)
        note = {"answers": [{"id": plan["questions"][0]["id"], "selected": [], "custom": "split it in two"}]}
        assert (await alice.post(f"/api/requests/{plan['id']}/answer", json=note)).status_code == 200
        await declined
        entries = (await alice.get("/api/history")).json()["entries"]
    remembered = next(e for e in entries if e["source"] == "asker" and e["event"] == "answered")
    assert remembered["remembered"] is True and remembered["by"] == "alice", remembered
    assert remembered["agent"] == "builder" and remembered["questions"][0]["question"] == "question q1?"
    answered = {e["agent"]: e for e in entries if e["source"] == "audit" and e["event"] == "answered"}
    assert answered["tester"]["questions"][0]["question"] == "question q1?", answered  # the second asker
    plan_entry = next(e for e in entries if e["questions"] and e["questions"][0].get("verdict"))
    assert (
        plan_entry["questions"][0]["verdict"] == "declined"
        and plan_entry["questions"][0]["custom"] == "split it in two"
    )


async def _askers_of(client: httpx.AsyncClient, request_id: str, count: int) -> bool:
    requests = (await client.get("/api/requests")).json()["requests"]
    return any(r["id"] == request_id and len(r["askers"]) == count for r in requests)


async def test_requests_page_by_a_cursor_and_filter(client: httpx.AsyncClient, make_broker: Callable[..., Any]) -> None:
    """``GET /api/requests?limit=&after=`` pages in the order shown; every request on exactly one page;
    ``agent``, ``priority`` and ``intent`` filter; a bad limit or cursor is a 400 (issue 27)."""
    asker = await make_broker()
    asks = [
        asking(asker, AskUserQuestionRequest(questions=(question("q1", "yes", "no", detail=f"step {i}"),), priority=p))
        for i, p in enumerate(["normal"] * 5 + ["urgent"] * 2)
    ]
    await eventually(lambda: _count(client), "7 requests show up")
    seen: list[str] = []
    cursor: str | None = None
    for expected in (3, 3, 1):
        params = {"limit": "3"} | ({"after": cursor} if cursor else {})
        page = (await client.get("/api/requests", params=params, headers=BEARER)).json()
        assert len(page["requests"]) == expected, page
        seen += [r["id"] for r in page["requests"]]
        cursor = page["next"]
        assert page["status"] == "active"
    assert cursor is None
    assert sorted(seen) == sorted(await pending_ids(client, headers=BEARER)) and len(set(seen)) == 7
    urgent = (await client.get("/api/requests", params={"priority": "urgent"}, headers=BEARER)).json()
    assert [r["priority"] for r in urgent["requests"]] == ["urgent", "urgent"] and urgent["next"] is None
    none = await client.get("/api/requests", params={"intent": "plan-review", "agent": "nobody"}, headers=BEARER)
    assert none.json()["requests"] == []
    for bad in ({"limit": "0"}, {"limit": "x"}, {"after": "a.b"}, {"limit": "1001"}):
        refused = await client.get("/api/requests", params=bad, headers=BEARER)
        assert refused.status_code == 400 and refused.json()["code"] == "BAD_REQUEST", bad
    for task in asks:
        task.cancel()
    await asyncio.gather(*asks, return_exceptions=True)


async def _count(client: httpx.AsyncClient) -> bool:
    return len(await pending_ids(client, headers=BEARER)) == 7


@pytest.mark.timeout(40)
async def test_an_attachment_is_served_to_signed_in_users_only_when_its_bytes_match(
    start_web: Callable[..., WebProcess], redis: Redis, make_broker: Callable[..., Any], namespace: str
) -> None:
    web = start_web()
    asker: Broker = await make_broker()
    text = '{"path": "' + "x" * 100_000 + '"}'
    digest = await asker.attach(text)
    async with httpx.AsyncClient(base_url=web.url) as anonymous:
        assert (await anonymous.get(f"/api/attachments/{digest}")).status_code == 401
    async with signed_in(web) as client:
        response = await client.get(f"/api/attachments/{digest}")
        assert response.status_code == 200, response.text
        assert response.json() == {"sha256": digest, "size": len(text), "text": text}
        # bytes an asker swapped in under the name: never served
        await redis.set(Keys(namespace).attachment(digest), "rm -rf /")
        assert (await client.get(f"/api/attachments/{digest}")).status_code == 404
        # gone (expired), and a name that is not a digest (never another key)
        assert (await client.get(f"/api/attachments/{'0' * 64}")).status_code == 404
        for name in ("req:1", "A" * 64, "%2E%2E%2Freq%3A1"):
            assert (await client.get(f"/api/attachments/{name}")).status_code in (400, 404)


@pytest.mark.timeout(50)
async def test_an_urgent_ask_behind_a_backlog_is_listed_first(
    client: httpx.AsyncClient, make_broker: Callable[..., Any]
) -> None:
    """199 normal asks, shown one by one, then 1 urgent: every listing starts with the urgent one (the
    order the providers present, docs/cli.md), not with the oldest normal ones."""
    asker = await make_broker()

    def ask(n: int, priority: str) -> asyncio.Task[AskUserQuestionAnswer]:
        item = question("q1", "yes", "no", detail=f"backlog step {n}")
        return asking(asker, AskUserQuestionRequest(questions=(item,), priority=priority))

    asks = [ask(n, "normal") for n in range(199)]
    try:

        async def shown(count: int) -> bool:
            return len(await pending_ids(client, headers=BEARER)) == count

        await eventually(lambda: shown(199), "199 normal requests show up")
        asks.append(ask(199, "urgent"))
        await eventually(lambda: shown(200), "the urgent request shows up")
        everything = (await client.get("/api/requests", headers=BEARER)).json()["requests"]
        first_page = (await client.get("/api/requests", params={"limit": "100"}, headers=BEARER)).json()
        assert everything[0]["priority"] == "urgent", [r["priority"] for r in everything[:3]]
        assert first_page["requests"][0]["priority"] == "urgent"
        assert [r["priority"] for r in first_page["requests"][1:]] == ["normal"] * 99
        # The rest, after the first page's cursor: every normal one once, the urgent one not again.
        rest = (
            await client.get("/api/requests", params={"limit": "1000", "after": first_page["next"]}, headers=BEARER)
        ).json()
        listed = [r["id"] for r in first_page["requests"] + rest["requests"]]
        assert sorted(listed) == sorted(r["id"] for r in everything) and len(set(listed)) == 200
    finally:
        for task in asks:
            task.cancel()
        await asyncio.gather(*asks, return_exceptions=True)
