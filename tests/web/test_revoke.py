"""Revoking a person takes effect at their next request (DESIGN invariant 15): the users file of a
running ``qbroker web`` is read again when it changes, over real HTTP, a real process and real Redis.

Every test edits the file the server was started with, as an operator would, and never restarts it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker import AskUserQuestionRequest, Broker
from tests.helpers import question
from tests.redis_server import RedisServer
from tests.web.conftest import WebProcess
from workers.answering.web.config import hash_password

pytestmark = [pytest.mark.slow, pytest.mark.timeout(45)]

PASSWORDS = {"alice": "alice-password", "bob": "bob-password", "carol": "carol-password"}
HASHES = {user: hash_password(password) for user, password in PASSWORDS.items()}
TOKEN = "ci-bot-token-0123456789abcdef"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
STREAM_ENDS_WITHIN = 8.0
"""an open stream must end on the change itself, not at its next keepalive (15 s)"""


def users_toml(*users: str, hashes: dict[str, str] | None = None, extra: str = "", token: bool = True) -> str:
    hashes = {**HASHES, **(hashes or {})}
    lines = ["[users]", *(f'{user} = "{hashes[user]}"' for user in users)]
    if token:
        lines += ["[tokens]", f'ci-bot = "{TOKEN}"']
    return "\n".join(lines) + "\n" + extra


def rewrite(path: Path, text: str) -> None:
    """The operator's edit: the same file rewritten in place (same inode), as an editor or ``>`` does."""
    if path.is_dir():
        path.rmdir()
    with path.open("w") as out:
        out.write(text)


def spoil(path: Path, how: str) -> None:
    if how == "unreadable":  # root reads any mode: a directory in its place cannot be read by anyone
        os.replace(path, path.with_suffix(".bak"))
        path.mkdir()
    elif how == "gone":
        path.unlink()
    else:
        path.write_bytes(b"[users\nalice = " if how == "malformed" else b'[users]\nbob = "\xff"\n')


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.toml"
    path.write_text(users_toml("alice", "bob"))
    return path


@pytest.fixture
def web(redis_server: RedisServer, namespace: str, users_file: Path, tmp_path: Path) -> Iterator[WebProcess]:
    process = WebProcess(redis_server.url, namespace, users_file, tmp_path / "web.log").start()
    yield process
    process.stop()


async def sign_in(client: httpx.AsyncClient, user: str, password: str | None = None) -> httpx.Response:
    return await client.post("/api/session", json={"user": user, "password": password or PASSWORDS[user]})


@asynccontextmanager
async def signed_in(web: WebProcess, user: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=web.url, timeout=STREAM_ENDS_WITHIN + 5) as client:
        response = await sign_in(client, user)
        assert response.status_code == 200, response.text
        client.headers["X-CSRF-Token"] = response.json()["csrf"]
        yield client


async def session_status(client: httpx.AsyncClient) -> int:
    return (await client.get("/api/session")).status_code


async def test_a_user_removed_from_the_file_is_signed_out_and_cannot_sign_in_again(
    web: WebProcess, users_file: Path
) -> None:
    async with signed_in(web, "bob") as bob, signed_in(web, "alice") as alice:
        assert await session_status(bob) == 200
        rewrite(users_file, users_toml("alice"))
        assert await session_status(bob) == 401  # his old cookie, at his next request
        assert (await bob.get("/api/requests")).status_code == 401
        async with httpx.AsyncClient(base_url=web.url) as fresh:
            refused = await sign_in(fresh, "bob")
        assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHENTICATED"
        assert await session_status(alice) == 200  # nobody else is signed out
        rewrite(users_file, users_toml("alice", "bob"))  # his very line back: the old session stays ended
        assert await session_status(bob) == 401


async def test_a_user_added_later_can_sign_in(web: WebProcess, users_file: Path) -> None:
    async with httpx.AsyncClient(base_url=web.url) as client:
        assert (await sign_in(client, "carol")).status_code == 401
        rewrite(users_file, users_toml("alice", "bob", "carol"))
        signed = await sign_in(client, "carol")
        assert signed.status_code == 200, signed.text
        assert signed.json()["user"] == "carol" and await session_status(client) == 200


async def test_a_password_change_ends_the_old_sessions(web: WebProcess, users_file: Path) -> None:
    async with signed_in(web, "alice") as old, signed_in(web, "bob") as bob:
        rewrite(users_file, users_toml("alice", "bob", hashes={"alice": hash_password("a-new-password")}))
        assert await session_status(old) == 401
        async with httpx.AsyncClient(base_url=web.url) as fresh:
            assert (await sign_in(fresh, "alice")).status_code == 401  # the old password
            assert (await sign_in(fresh, "alice", "a-new-password")).status_code == 200
            assert await session_status(fresh) == 200
        assert await session_status(bob) == 200


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ('[groups]\nsre = ["bob"]\n', '[groups]\nsre = ["bob", "alice"]\n'),
        ('[namespaces]\nalice = ["{ns}"]\nbob = ["{ns}"]\n', '[namespaces]\nalice = ["{ns}", "x"]\nbob = ["{ns}"]\n'),
    ],
    ids=["groups-changed", "namespaces-changed"],
)
async def test_a_change_to_what_a_user_may_do_ends_their_sessions(
    web: WebProcess, users_file: Path, namespace: str, before: str, after: str
) -> None:
    """The page learns who it is and where it may answer when it signs in: a change makes it sign in again."""
    rewrite(users_file, users_toml("alice", "bob", extra=before.format(ns=namespace)))
    async with signed_in(web, "alice") as alice, signed_in(web, "bob") as bob:
        rewrite(users_file, users_toml("alice", "bob", extra=after.format(ns=namespace)))
        assert await session_status(alice) == 401
        assert await session_status(bob) == 200  # what the file says of bob did not change
        async with signed_in(web, "alice") as again:
            assert await session_status(again) == 200


async def test_a_removed_token_is_refused_at_its_next_request(web: WebProcess, users_file: Path) -> None:
    async with httpx.AsyncClient(base_url=web.url) as client:
        assert (await client.get("/api/requests", headers=BEARER)).status_code == 200
        rewrite(users_file, users_toml("alice", "bob", token=False))
        assert (await client.get("/api/requests", headers=BEARER)).status_code == 401


async def test_an_open_event_stream_of_a_removed_user_ends(web: WebProcess, users_file: Path) -> None:
    """The stream was opened before the removal, and nothing else is asked of the server meanwhile."""
    async with signed_in(web, "bob") as bob, signed_in(web, "alice") as alice:
        async with bob.stream("GET", "/api/events") as bobs, alice.stream("GET", "/api/events") as alices:
            assert bobs.status_code == 200 and alices.status_code == 200
            lines, others = bobs.aiter_lines(), alices.aiter_lines()
            while not (await anext(lines)).startswith("event: snapshot"):
                pass
            while not (await anext(others)).startswith("event: snapshot"):
                pass
            rewrite(users_file, users_toml("alice"))
            async with asyncio.timeout(STREAM_ENDS_WITHIN):
                async for _ in lines:  # the server ends the response
                    pass
            assert not alices.is_closed
        assert await session_status(alice) == 200


async def test_a_tokens_open_stream_ends_when_where_it_may_answer_changed(web: WebProcess, users_file: Path) -> None:
    """A token has no session to end: its stream ends so that it is opened again for the namespaces of now."""
    async with httpx.AsyncClient(base_url=web.url, headers=BEARER, timeout=STREAM_ENDS_WITHIN + 5) as client:
        async with client.stream("GET", "/api/events") as events:
            lines = events.aiter_lines()
            while not (await anext(lines)).startswith("event: snapshot"):
                pass
            rewrite(users_file, users_toml("alice", "bob", extra='[namespaces]\nci-bot = ["elsewhere"]\n'))
            async with asyncio.timeout(STREAM_ENDS_WITHIN):
                async for _ in lines:
                    pass
        assert (await client.get("/api/session")).json()["namespaces"] == []  # the token holds, for nowhere here


@pytest.mark.parametrize("how", ["malformed", "unreadable", "not-utf8"])
async def test_a_users_file_turned_bad_keeps_the_last_good_users(web: WebProcess, users_file: Path, how: str) -> None:
    """A broken edit neither lets everyone in nor locks everyone out; the log says what is wrong."""
    async with signed_in(web, "alice") as alice:
        spoil(users_file, how)
        assert await session_status(alice) == 200
        async with httpx.AsyncClient(base_url=web.url) as client:
            assert (await sign_in(client, "bob")).status_code == 200  # the last good file's users
            assert (await sign_in(client, "carol")).status_code == 401
        assert "USERS_FILE_INVALID" in web.log_path.read_text()
        rewrite(users_file, users_toml("bob"))  # mended: read again, alice now removed
        assert await session_status(alice) == 401


async def test_a_users_file_deleted_lets_nobody_in(web: WebProcess, users_file: Path) -> None:
    async with signed_in(web, "alice") as alice:
        spoil(users_file, "gone")
        assert await session_status(alice) == 401
        assert (await alice.get("/api/requests", headers=BEARER)).status_code == 401
        rewrite(users_file, users_toml("alice"))
        async with signed_in(web, "alice") as again:
            assert await session_status(again) == 200


POLICY = '[[policy]]\nname = "deploys"\napprovals = 2\ngroups = ["sre"]\napprove = ["Deploy"]\n'


async def test_group_membership_is_read_again_for_the_next_vote(
    redis_server: RedisServer,
    namespace: str,
    users_file: Path,
    tmp_path: Path,
    make_broker: Callable[..., Any],
) -> None:
    """ci-bot (a token: no session to end) leaves sre and is refused; carol joins and her vote counts."""
    policy = tmp_path / "policy.toml"
    rewrite(policy, POLICY)
    rewrite(users_file, users_toml("alice", "bob", "carol", extra='[groups]\nsre = ["alice", "ci-bot"]\n'))
    web = WebProcess(
        redis_server.url, namespace, users_file, tmp_path / "quorum.log", extra=["--policy-file", str(policy)]
    ).start()
    asker: Broker = await make_broker()
    asked = asyncio.create_task(
        asker.ask(AskUserQuestionRequest(questions=(question("q1", "Deploy", "Hold"),)), abort=None, timeout=30)
    )
    try:
        deploy = {"answers": [{"id": "q1", "selected": ["Deploy"]}]}
        async with httpx.AsyncClient(base_url=web.url, headers=BEARER, timeout=5) as bot:
            async with asyncio.timeout(10):
                while not (requests := (await bot.get("/api/requests")).json()["requests"]):
                    await asyncio.sleep(0.05)
            card = requests[0]["id"]
            rewrite(users_file, users_toml("alice", "bob", "carol", extra='[groups]\nsre = ["alice", "carol"]\n'))
            refused = await bot.post(f"/api/requests/{card}/answer", json=deploy)
            assert refused.status_code == 403 and refused.json()["code"] == "NOT_APPROVER", refused.text
        async with signed_in(web, "carol") as carol, signed_in(web, "alice") as alice:
            voted = await carol.post(f"/api/requests/{card}/answer", json=deploy)
            assert voted.status_code == 202, voted.text
            decided = await alice.post(f"/api/requests/{card}/answer", json=deploy)
            assert decided.status_code == 200, decided.text
            assert decided.json()["by"] == "carol, alice"
        assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("Deploy",)
    finally:
        asked.cancel()
        web.stop()
