"""Slack as a face of ``qbroker web`` (docs/slack.md): a real web process, a real redis-server, a fake Slack.

The web process posts each card to the fake Slack Web API; the tests click its buttons with
``block_actions`` / ``view_submission`` payloads signed like Slack's, POSTed to the real
``/slack/interactive`` endpoint, and check what the asker got and what Slack was told.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PlanReviewIntent,
    UserQuestionError,
)
from tests.helpers import one_question, question
from tests.redis_server import RedisServer
from tests.slack.fake_slack import (
    APP_TOKEN,
    BOT_TOKEN,
    SIGNING_SECRET,
    FakeSlack,
    block_actions,
    signed,
    view_submission,
)
from tests.web.conftest import PASSWORDS, SSL_CONTEXT, WebProcess, write_users_file

pytestmark = [pytest.mark.slow, pytest.mark.timeout(45)]

SLACK_USERS = '[slack]\nalice = "UALICE"\nbob = "bob@example.com"\n'


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack(emails={"UBOB": "Bob@Example.com", "UMALLORY": "mallory@example.com"}).serving() as fake:
        yield fake


@pytest.fixture
async def start_slack_web(
    slack: FakeSlack, redis_server: RedisServer, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Awaitable[WebProcess]]]:
    started: list[WebProcess] = []

    async def start(users_extra: str = "", *extra: str, socket_mode: bool = False, name: str = "web-1") -> WebProcess:
        users = write_users_file(tmp_path / "users.toml")
        users.write_text(users.read_text() + users_extra + SLACK_USERS)
        config = tmp_path / "slack.toml"
        config.write_text(
            f'channel = "CAPPROVALS"\napi_url = "{slack.api_url}"\n'
            + ("socket_mode = true\n" if socket_mode else "")
            + "\n"
            '[[route]]\nchannel = "CURGENT"\npriority = ["urgent"]\n\n'
            '[[route]]\nchannel = "CDEPLOYS"\nagent = ["deploy-*"]\n'
        )
        monkeypatch.setenv("QBROKER_SLACK_BOT_TOKEN", BOT_TOKEN)
        if socket_mode:  # the app-level token instead of the signing secret: no request URL to sign for
            monkeypatch.setenv("QBROKER_SLACK_APP_TOKEN", APP_TOKEN)
            monkeypatch.delenv("QBROKER_SLACK_SIGNING_SECRET", raising=False)
        else:
            monkeypatch.setenv("QBROKER_SLACK_SIGNING_SECRET", SIGNING_SECRET)
        process = WebProcess(
            redis_server.url,
            namespace,
            users,
            tmp_path / f"{name}.log",
            name=name,
            extra=["--slack-config", str(config), *extra],
        )
        started.append(process)
        return await asyncio.to_thread(process.start)

    yield start
    for process in started:
        await asyncio.to_thread(process.stop)


@pytest.fixture
async def web(start_slack_web: Callable[..., Awaitable[WebProcess]]) -> WebProcess:
    return await start_slack_web()


async def post(web: WebProcess, payload: dict[str, Any], **signing: Any) -> httpx.Response:
    body, headers = signed(payload, **signing)
    async with httpx.AsyncClient(base_url=web.url, verify=SSL_CONTEXT) as client:
        return await client.post("/slack/interactive", content=body, headers=headers)


async def card(slack: FakeSlack, index: int = 0) -> dict[str, Any]:
    """The ``index``-th card posted (thread replies left out)."""
    posted = await slack.wait_for("chat.postMessage", index + 1, where=lambda args: "thread_ts" not in args)
    return posted[index]


async def updated(slack: FakeSlack, text: str) -> dict[str, Any]:
    """The chat.update whose text says ``text``."""
    found = await slack.wait_for("chat.update", where=lambda args: text in json.dumps(args))
    return found[-1]


async def ephemeral(slack: FakeSlack, user: str, text: str) -> dict[str, Any]:
    found = await slack.wait_for("chat.postEphemeral", where=lambda args: args["user"] == user and text in args["text"])
    return found[-1]


def asking(broker: Broker, request: AskUserQuestionRequest, timeout: float = 30) -> asyncio.Task[AskUserQuestionAnswer]:
    return asyncio.create_task(broker.ask(request, abort=None, timeout=timeout))


async def test_a_card_is_posted_with_buttons_and_a_click_answers_it(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no", agent=None))
    posted = await card(slack)
    assert posted["channel"] == "CAPPROVALS"
    context = json.dumps(posted["blocks"][0])
    assert "from *an agent*" in context and "normal" in context and "answer by <!date^" in context
    assert "question q1?" in json.dumps(posted["blocks"])
    response = await post(web, block_actions(posted, "qb_pick_0", user="UALICE", ts="1700000000.000001"))
    assert response.status_code == 200, response.text
    answer = await asyncio.wait_for(asked, 10)
    assert answer.answers[0].selected == ("yes",)
    done = await updated(slack, "Answered by alice in Slack")
    assert done["ts"] == "1700000000.000001" and not [b for b in done["blocks"] if b["type"] == "actions"]


async def test_a_card_goes_to_the_channel_its_priority_or_agent_picks(web, slack, make_broker) -> None:
    asker = await make_broker()
    urgent = AskUserQuestionRequest(questions=(question("q1", "yes", "no"),), priority="urgent")
    first = asking(asker, urgent)
    assert (await card(slack, 0))["channel"] == "CURGENT"
    async with asker.agent("deploy-7"):
        deploy = AskUserQuestionRequest(questions=(question("q2", "ship", "wait"),), agent="deploy-7")
        second = asking(asker, deploy)  # another question: identical ones would be coalesced into the first card
        posted = await card(slack, 1)
        second.cancel()
    first.cancel()
    assert posted["channel"] == "CDEPLOYS"
    assert "from *deploy-7*" in json.dumps(posted["blocks"][0])


async def test_multi_select_takes_the_ticked_boxes_on_submit(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, AskUserQuestionRequest(questions=(question("q1", "a", "b", "c", multi=True),)))
    posted = await card(slack)
    await post(web, block_actions(posted, "qb_submit", user="UALICE", ticked={"qbq_0": [0, 2]}))
    answer = await asyncio.wait_for(asked, 10)
    assert answer.answers[0].selected == ("a", "c")


async def test_other_opens_a_modal_whose_text_is_the_answer(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    await post(web, block_actions(posted, "qb_other", user="UALICE"))
    (opened,) = await slack.wait_for("views.open")
    assert opened["trigger_id"].endswith("UALICE") and opened["view"]["callback_id"] == "qb_other"
    response = await post(web, view_submission(opened["view"], user="UALICE", texts={"qbt_0": "only on Tuesdays"}))
    assert response.status_code == 200 and response.content == b""  # closes the modal
    answer = await asyncio.wait_for(asked, 10)
    assert answer.answers[0].custom == "only on Tuesdays" and answer.answers[0].selected == ()


async def test_a_long_plan_goes_to_the_thread_and_is_declined_with_a_note(web, slack, make_broker) -> None:
    plan = "# Plan\n" + "\n".join(f"{i}. step {i} <!channel> & more" for i in range(400))
    item = AskUserQuestionItem(
        id="plan",
        question="Run this plan?",
        detail=plan,
        options=(AskUserQuestionOption(label="Approve"), AskUserQuestionOption(label="Refuse")),
        intent=PlanReviewIntent(approve="Approve"),
    )
    asker = await make_broker()
    asked = asking(asker, AskUserQuestionRequest(questions=(item,)))
    posted = await card(slack)
    text = json.dumps(posted["blocks"])
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text  # asker text cannot ping anyone
    assert "qb_approve" in text and "qb_decline" in text and "qb_pick_0" not in text
    in_thread = lambda args: args.get("thread_ts") == "1700000000.000001"  # noqa: E731
    await slack.wait_for("chat.postMessage", where=lambda args: in_thread(args) and "step 399" in args["text"])
    thread = "".join(args["text"] for args in slack.made("chat.postMessage") if in_thread(args))
    assert "step 0 " in thread and "<!channel>" not in thread  # whole, and inert
    await post(web, block_actions(posted, "qb_decline", user="UALICE"))
    (opened,) = await slack.wait_for("views.open")
    assert opened["view"]["callback_id"] == "qb_decline"
    await post(web, view_submission(opened["view"], user="UALICE", texts={"qbt_0": "skip step 3"}))
    answer = await asyncio.wait_for(asked, 10)
    assert answer.answers[0].custom == "skip step 3"
    await updated(slack, "Answered by alice in Slack")


async def test_a_plan_is_approved_with_one_click(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(
        asker,
        AskUserQuestionRequest(
            questions=(
                question("plan", "Approve", "Refuse", detail="do it", intent=PlanReviewIntent(approve="Approve")),
            )
        ),
    )
    posted = await card(slack)
    await post(web, block_actions(posted, "qb_approve", user="UBOB"))  # bob, mapped by email through users.info
    answer = await asyncio.wait_for(asked, 10)
    assert answer.answers[0].selected == ("Approve",)
    assert slack.made("users.info") and slack.made("users.info")[0]["user"] == "UBOB"
    await updated(slack, "Answered by bob in Slack")


async def test_the_web_answers_first_and_a_late_slack_click_is_told(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    async with httpx.AsyncClient(base_url=web.url, verify=SSL_CONTEXT) as page:
        session = await page.post("/api/session", json={"user": "bob", "password": PASSWORDS["bob"]})
        page.headers["X-CSRF-Token"] = session.json()["csrf"]
        rid = json.loads(posted["blocks"][-1]["elements"][0]["value"])["r"]
        answered = await page.post(f"/api/requests/{rid}/answer", json={"answers": [{"id": "q1", "selected": ["no"]}]})
        assert answered.status_code == 200, answered.text
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("no",)
    await updated(slack, "Answered by bob on the web")
    await post(web, block_actions(posted, "qb_pick_0", user="UALICE"))
    await ephemeral(slack, "UALICE", "Already answered by bob")


async def test_slack_answers_first_and_the_page_is_told_who_won(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    rid = json.loads(posted["blocks"][-1]["elements"][0]["value"])["r"]
    await post(web, block_actions(posted, "qb_pick_1", user="UALICE"))
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("no",)
    async with httpx.AsyncClient(base_url=web.url, verify=SSL_CONTEXT) as page:
        session = await page.post("/api/session", json={"user": "bob", "password": PASSWORDS["bob"]})
        page.headers["X-CSRF-Token"] = session.json()["csrf"]
        late = await page.post(f"/api/requests/{rid}/answer", json={"answers": [{"id": "q1", "selected": ["yes"]}]})
    assert late.status_code == 409 and late.json()["winner"]["by"] == "alice"


async def test_a_bad_signature_and_a_replay_are_refused(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    forged = await post(web, block_actions(posted, "qb_pick_0", user="UALICE"), secret="not the app's secret")
    assert forged.status_code == 401 and forged.json()["error"] == "bad signature"
    payload = block_actions(posted, "qb_pick_1", user="UALICE")
    body, headers = signed(payload)
    async with httpx.AsyncClient(base_url=web.url, verify=SSL_CONTEXT) as client:
        first = await client.post("/slack/interactive", content=body, headers=headers)
        replayed = await client.post("/slack/interactive", content=body, headers=headers)
    assert first.status_code == 200 and replayed.status_code == 401
    assert replayed.json()["error"].startswith("replayed")
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("no",)  # the forged "yes" did nothing


async def test_an_unmapped_slack_user_is_refused_and_the_card_stays(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    await post(web, block_actions(posted, "qb_pick_0", user="UMALLORY"))
    await ephemeral(slack, "UMALLORY", "not mapped")
    await asyncio.sleep(0.3)
    assert not asked.done() and not slack.made("chat.update")
    await post(web, block_actions(posted, "qb_pick_1", user="UALICE"))
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("no",)


@pytest.mark.parametrize("socket_mode", [False, True], ids=["request-url", "socket-mode"])
async def test_a_click_is_acknowledged_before_a_rate_limited_web_api_takes_the_reply(
    start_slack_web, slack, make_broker, socket_mode
) -> None:
    """Slack shows the clicker an error when the ack takes over 3 s: nothing the Web API does may hold it up.

    chat.postEphemeral answers 429 (Retry-After 2) twice, as Slack's rate limit does: the ack must not wait
    for the retries (it took 5.7 s). Judged by order, not by a clock: the ack is in before the post lands.
    """
    web = await start_slack_web(socket_mode=socket_mode)
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    slack.rate_limited["chat.postEphemeral"] = 2
    click = block_actions(posted, "qb_pick_0", user="UMALLORY")
    if socket_mode:
        await slack.ack_of(await slack.envelope(click))
    else:
        assert (await post(web, click)).status_code == 200
    assert not slack.made("chat.postEphemeral"), "the ack waited for the Web API"
    await ephemeral(slack, "UMALLORY", "not mapped")  # told all the same, once Slack takes it
    assert len(slack.made("chat.postEphemeral:429")) == 2
    assert not asked.done()


async def test_a_card_that_times_out_is_updated_in_place(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"), timeout=1.5)
    posted = await card(slack)
    with pytest.raises(UserQuestionError) as raised:
        await asyncio.wait_for(asked, 10)
    assert raised.value.code == "ASK_TIMED_OUT"
    done = await updated(slack, "Timed out")
    assert done["ts"] == "1700000000.000001" and done["channel"] == posted["channel"]


async def test_a_slack_click_is_one_persons_vote_on_a_quorum_card(
    start_slack_web, slack, make_broker, tmp_path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[policy]]\nname = "deploys"\napprovals = 2\ngroups = ["sre"]\napprove = ["Deploy"]\n')
    web = await start_slack_web('[groups]\nsre = ["alice", "bob"]\n', "--policy-file", str(policy))
    asker = await make_broker()
    asked = asking(asker, AskUserQuestionRequest(questions=(question("q1", "Deploy", "Hold"),)))
    posted = await card(slack)
    assert "Needs 2 approvals from sre" in json.dumps(posted["blocks"])
    await post(web, block_actions(posted, "qb_pick_0", user="UALICE"))
    await ephemeral(slack, "UALICE", "Your vote is recorded")
    await updated(slack, "approved by alice")
    await post(web, block_actions(posted, "qb_pick_0", user="UALICE"))  # the same person twice counts once
    await asyncio.sleep(0.5)
    assert not asked.done()
    await post(web, block_actions(posted, "qb_pick_0", user="UBOB"))
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("Deploy",)
    await updated(slack, "Answered by alice, bob in Slack")


async def test_a_routed_card_says_who_may_answer_refuses_others_then_escalates(
    start_slack_web, slack, make_broker, tmp_path
) -> None:
    """Routed to sre (alice); bob, mapped but not a member, is refused until the card escalates to leads."""
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[policy]]\nname = "billing"\nmatch = { header = "Billing" }\nroute = "sre"\n'
        'escalate = { after = "1500ms", to = "leads" }\n'
    )
    web = await start_slack_web('[groups]\nsre = ["alice"]\nleads = ["bob"]\n', "--policy-file", str(policy))
    asker = await make_broker()
    item = question("q1", "Pay", "Hold", header="Billing")
    asked = asking(asker, AskUserQuestionRequest(questions=(item,)))
    posted = await card(slack)
    text = json.dumps(posted["blocks"])
    assert "<@UALICE>" in text and "Only sre may answer: alice" in text and "escalates to leads" in text
    await post(web, block_actions(posted, "qb_pick_0", user="UBOB"))
    refused = await ephemeral(slack, "UBOB", "Not taken")
    assert "routed" in refused["text"] or "not an approver" in refused["text"]
    assert not asked.done()
    escalated = await slack.wait_for(
        "chat.update", where=lambda args: "sre or leads may answer" in json.dumps(args.get("blocks"))
    )
    assert "may answer: alice, bob" in json.dumps(escalated[-1]["blocks"])  # bob is mapped by email: no id to mention
    await post(web, block_actions(posted, "qb_pick_0", user="UBOB"))
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("Pay",)
    await updated(slack, "Answered by bob in Slack")


async def test_socket_mode_takes_each_envelope_acks_it_and_answers(start_slack_web, slack, make_broker) -> None:
    """No request URL: the clicks come down the Socket Mode connection as envelopes, each acked by its id."""
    web = await start_slack_web(socket_mode=True)
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    await slack.wait_for("apps.connections.open")
    opening = await slack.envelope(block_actions(posted, "qb_other", user="UALICE"))
    assert (await slack.ack_of(opening)) == {"envelope_id": opening}
    (opened,) = await slack.wait_for("views.open")
    refused = await slack.envelope(view_submission(opened["view"], user="UMALLORY", texts={"qbt_0": "mine"}))
    ack = await slack.ack_of(refused)  # a modal's errors ride on the ack, as on the HTTP response
    assert ack["payload"]["response_action"] == "errors" and "not mapped" in json.dumps(ack["payload"])
    clicked = await slack.envelope(block_actions(posted, "qb_pick_1", user="UALICE", ts="1700000000.000001"))
    assert (await slack.ack_of(clicked))["envelope_id"] == clicked
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("no",)
    await updated(slack, "Answered by alice in Slack")
    # No signing secret was given: the request URL takes nothing, not even a request "signed" with none.
    again = asking(asker, one_question("up", "down"))
    second = await card(slack, 1)
    forged = await post(web, block_actions(second, "qb_pick_0", user="UALICE"), secret="")
    assert forged.status_code == 401
    await asyncio.sleep(0.3)
    assert not again.done()
    again.cancel()


async def test_only_the_lease_holder_holds_the_socket_mode_connection(start_slack_web, slack, make_broker) -> None:
    """Slack hands each envelope to one of the app's connections: a standby's would only say "not taken"."""
    first = await start_slack_web(socket_mode=True, name="web-1")
    await start_slack_web(socket_mode=True, name="web-2")
    async with asyncio.timeout(10):
        while slack.connected < 1:
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.5)
    assert slack.connected == 1 and len(slack.links) == 1
    await asyncio.to_thread(first.stop)
    async with asyncio.timeout(15):  # the lease (2 s) passes to web-2, which connects
        while not (slack.connected == 2 and len(slack.links) == 1):
            await asyncio.sleep(0.05)
    asker = await make_broker()
    asked = asking(asker, one_question("yes", "no"))
    posted = await card(slack)
    await slack.envelope(block_actions(posted, "qb_pick_0", user="UALICE"))
    assert (await asyncio.wait_for(asked, 10)).answers[0].selected == ("yes",)


async def test_submit_with_nothing_ticked_is_not_a_skip(web, slack, make_broker) -> None:
    """Only a person's explicit skip is a skip: Submit with a question left unticked answers nothing."""
    asker = await make_broker()
    asked = asking(asker, AskUserQuestionRequest(questions=(question("q1", "a", "b"), question("q2", "c", "d"))))
    posted = await card(slack)
    await post(web, block_actions(posted, "qb_submit", user="UALICE", ticked={"qbq_0": [1]}))
    await ephemeral(slack, "UALICE", "Nothing is picked for")
    await asyncio.sleep(0.3)
    assert not asked.done()
    await post(web, block_actions(posted, "qb_submit", user="UALICE", ticked={"qbq_0": [1], "qbq_1": [0]}))
    answer = await asyncio.wait_for(asked, 10)
    assert [item.selected for item in answer.answers] == [("b",), ("c",)]


async def test_other_with_a_question_left_blank_is_not_a_skip(web, slack, make_broker) -> None:
    asker = await make_broker()
    asked = asking(asker, AskUserQuestionRequest(questions=(question("q1", "a", "b"), question("q2", "c", "d"))))
    posted = await card(slack)
    await post(web, block_actions(posted, "qb_other", user="UALICE", ticked={"qbq_0": [0]}))
    (opened,) = await slack.wait_for("views.open")
    response = await post(web, view_submission(opened["view"], user="UALICE", texts={"qbt_0": "", "qbt_1": ""}))
    assert response.json()["errors"] == {"qbt_1": "Write an answer, or pick one on the card first."}
    assert not asked.done()
    response = await post(web, view_submission(opened["view"], user="UALICE", texts={"qbt_1": "mine"}))
    answer = await asyncio.wait_for(asked, 10)
    assert [(item.selected, item.custom) for item in answer.answers] == [(("a",), None), ((), "mine")]
