"""The users file's ``[slack]`` mapping is read again when it changes (docs/slack.md): a real web
process, a real redis-server and the fake Slack; the file is edited while the server runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker import AskUserQuestionAnswer, Broker
from tests.helpers import one_question
from tests.redis_server import RedisServer
from tests.slack.fake_slack import BOT_TOKEN, SIGNING_SECRET, FakeSlack, block_actions, signed
from tests.web.conftest import WebProcess, write_users_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(45)]


def mapping(**users: str) -> str:
    return "[slack]\n" + "".join(f'{user} = "{slack}"\n' for user, slack in users.items())


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(emails={"UDAVE": "dave@example.com"}).serving() as fake:
        yield fake


@pytest.fixture
async def web_and_users(
    slack: FakeSlack, redis_server: RedisServer, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[WebProcess, Path]]:
    users = write_users_file(tmp_path / "users.toml")
    base = users.read_text()
    users.write_text(base + mapping(alice="UALICE", bob="UBOB", dave="dave@example.com"))
    config = tmp_path / "slack.toml"
    config.write_text(f'channel = "CAPPROVALS"\napi_url = "{slack.api_url}"\n')
    monkeypatch.setenv("QBROKER_SLACK_BOT_TOKEN", BOT_TOKEN)
    monkeypatch.setenv("QBROKER_SLACK_SIGNING_SECRET", SIGNING_SECRET)
    process = WebProcess(
        redis_server.url, namespace, users, tmp_path / "web.log", extra=["--slack-config", str(config)]
    )
    await asyncio.to_thread(process.start)
    yield process, users
    await asyncio.to_thread(process.stop)


async def click(web: WebProcess, posted: dict[str, Any], action: str, user: str) -> None:
    body, headers = signed(block_actions(posted, action, user=user))
    async with httpx.AsyncClient(base_url=web.url) as client:
        response = await client.post("/slack/interactive", content=body, headers=headers)
    assert response.status_code == 200, response.text


async def told_not_mapped(slack: FakeSlack, user: str, asked: asyncio.Task[Any]) -> None:
    try:
        await slack.wait_for("chat.postEphemeral", where=lambda a: a["user"] == user and "not mapped" in a["text"])
    except TimeoutError:
        raise AssertionError(f"{user} was not refused (the card answered: {asked.done()})") from None


async def posted_card(slack: FakeSlack) -> dict[str, Any]:
    found = await slack.wait_for("chat.postMessage", where=lambda args: "thread_ts" not in args)
    return found[0]


def asking(broker: Broker) -> asyncio.Task[AskUserQuestionAnswer]:
    return asyncio.create_task(broker.ask(one_question("yes", "no"), abort=None, timeout=30))


@pytest.mark.parametrize(("removed", "slack_user"), [("bob", "UBOB"), ("dave", "UDAVE")], ids=["by-id", "by-email"])
async def test_a_removed_mapping_stops_that_slack_user_at_the_next_click(
    web_and_users: tuple[WebProcess, Path], slack: FakeSlack, make_broker: Any, removed: str, slack_user: str
) -> None:
    web, users = web_and_users
    asked = asking(await make_broker())
    posted = await posted_card(slack)
    kept = {"alice": "UALICE", "bob": "UBOB", "dave": "dave@example.com"}
    del kept[removed]
    text = users.read_text().split("[slack]")[0] + mapping(**kept)
    with users.open("w") as out:  # edited in place, as an operator would
        out.write(text)
    await click(web, posted, "qb_pick_0", slack_user)
    await told_not_mapped(slack, slack_user, asked)
    await asyncio.sleep(0.3)
    assert not asked.done() and not slack.made("chat.update")  # the card stays
    await click(web, posted, "qb_pick_1", "UALICE")
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("no",)


async def test_a_mapping_added_later_may_answer(
    web_and_users: tuple[WebProcess, Path], slack: FakeSlack, make_broker: Any
) -> None:
    web, users = web_and_users
    asked = asking(await make_broker())
    posted = await posted_card(slack)
    await click(web, posted, "qb_pick_0", "UCAROL")
    await told_not_mapped(slack, "UCAROL", asked)
    users.write_text(users.read_text() + 'carol = "UCAROL"\n')
    await click(web, posted, "qb_pick_0", "UCAROL")
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("yes",)
    done = await slack.wait_for("chat.update", where=lambda args: "Answered by carol" in json.dumps(args))
    assert done
