"""``qbroker ask`` as a real process: answers on stdout, errors on stderr, one exit status per code."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time

import msgspec
import pytest

from broker import ERROR_CODES, AskUserQuestionRequest, UserQuestionError
from broker.types import decode_answer
from tests.helpers import answer
from tests.workers.procs import delivered_to, env_for, run_qbroker
from workers.exits import EXIT_STATUS


def test_exit_status_table_is_total_and_distinct():
    assert set(EXIT_STATUS) == set(ERROR_CODES)
    statuses = list(EXIT_STATUS.values())
    assert len(set(statuses)) == len(statuses)
    assert not {0, 1, 2} & set(statuses)  # success, internal error, usage error


async def _ask_answered_by(make_broker, redis_server, namespace, respond, *args, stdin=None):
    """Run ``qbroker ask ARGS`` while an in-process provider calls ``respond(pending)``."""
    provider_broker = await make_broker()
    async with provider_broker.provider("test-provider") as provider:
        asking = asyncio.create_task(run_qbroker("ask", *args, url=redis_server.url, namespace=namespace, stdin=stdin))
        pending = await delivered_to(provider, asking, "the asker")
        seen = pending.request
        await respond(pending)
        status, out, err = await asyncio.wait_for(asking, 15)
    return seen, status, out, err


async def test_flags_build_the_question_and_the_answer_is_json_on_stdout(
    make_broker, redis_server, namespace, tmp_path
):
    detail = tmp_path / "detail.md"
    detail.write_text("# Why\nbecause")

    async def respond(pending):
        await pending.answer(answer(("pick", ("red", "blue"), "teal")))

    seen, status, out, err = await _ask_answered_by(
        make_broker, redis_server, namespace, respond,
        "--question", "Colours?", "--id", "pick", "--option", "red=warm", "--option", "blue",
        "--multi", "--header", "Paint", "--detail-file", str(detail),
    )  # fmt: skip
    assert status == 0, err
    item = seen.questions[0]
    assert (item.id, item.question, item.header, item.detail, item.multi_select) == (
        "pick", "Colours?", "Paint", "# Why\nbecause", True,
    )  # fmt: skip
    assert [(o.label, o.description) for o in item.options or ()] == [("red", "warm"), ("blue", None)]
    assert json.loads(out) == {"answers": [{"id": "pick", "selected": ["red", "blue"], "custom": "teal"}]}


async def test_request_from_stdin_keeps_unknown_intents(make_broker, redis_server, namespace):
    request = {
        "questions": [
            {
                "id": "a",
                "question": "A?",
                "options": [{"label": "x"}],
                "detail": "d",
                "intent": {"kind": "future", "z": 1},
            },
            {"id": "b", "question": "B?"},
        ]
    }

    async def respond(pending):
        await pending.answer(answer(("a", ("x",), None), ("b", (), None)))

    seen, status, out, err = await _ask_answered_by(
        make_broker, redis_server, namespace, respond, "--request", "-", stdin=json.dumps(request).encode()
    )
    assert status == 0, err
    assert seen.questions[0].intent is not None and seen.questions[0].intent.kind == "future"
    assert decode_answer(out) == answer(("a", ("x",), None), ("b", (), None))


async def test_cancel_by_the_human_exits_with_ask_cancelled(make_broker, redis_server, namespace):
    async def respond(pending):
        await pending.cancel("not now")

    _, status, out, err = await _ask_answered_by(
        make_broker, redis_server, namespace, respond, "-q", "Go?", "-o", "yes", "-o", "no"
    )
    assert (status, out) == (EXIT_STATUS["ASK_CANCELLED"], b"")
    assert json.loads(err) == {"name": "UserQuestionError", "code": "ASK_CANCELLED", "message": "not now"}


BAD_INTENT_REQUEST = {
    "questions": [
        {
            "id": "p",
            "question": "Plan?",
            "options": [{"label": "ok"}],
            "intent": {"kind": "plan-review", "approve": "go"},
        }
    ]
}
GHOST_REQUEST = {"questions": [{"id": "q", "question": "?"}], "agent": "ghost"}


@pytest.mark.parametrize(
    ("code", "args", "stdin"),
    [
        pytest.param("NO_PROVIDER", ["-q", "Anyone?"], None, id="no-provider"),
        pytest.param("EMPTY_QUESTIONS", ["-r", "-"], b'{"questions": []}', id="empty"),
        pytest.param("BAD_INTENT", ["-r", "-"], json.dumps(BAD_INTENT_REQUEST).encode(), id="bad-intent"),
        pytest.param("BAD_REQUEST", ["-r", "-"], b"{not json", id="malformed-json"),
        pytest.param("BAD_REQUEST", ["-q", "Dup?", "-o", "a", "-o", "a"], None, id="duplicate-labels"),
        pytest.param("BAD_REQUEST", [], None, id="nothing-to-ask"),
        pytest.param("BAD_REQUEST", ["-q", "Now?", "--priority", "critical"], None, id="unknown-priority"),
        pytest.param("BAD_REQUEST", ["-r", "/nonexistent/request.json"], None, id="unreadable-file"),
        pytest.param("CALLER_NOT_LIVE", ["-r", "-"], json.dumps(GHOST_REQUEST).encode(), id="agent-not-live"),
        pytest.param("CALLER_NOT_LIVE", ["-q", "?", "--agent", "kid", "--owner", "nobody"], None, id="owner-not-live"),
    ],
)  # fmt: skip
async def test_refused_asks_print_the_error_and_exit_with_its_status(redis_server, namespace, code, args, stdin):
    status, out, err = await run_qbroker("ask", *args, url=redis_server.url, namespace=namespace, stdin=stdin)
    assert out == b""
    payload = json.loads(err.splitlines()[-1])
    assert (status, payload["code"], payload["name"]) == (EXIT_STATUS[code], code, "UserQuestionError")
    assert payload["message"]


async def test_an_owned_agent_gets_delegated_caller(make_broker, redis_server, namespace):
    broker = await make_broker()
    async with broker.agent("parent"), broker.provider("p"):
        status, _, err = await run_qbroker(
            "ask", "-q", "?", "--agent", "child", "--owner", "parent", url=redis_server.url, namespace=namespace
        )
    assert (status, json.loads(err)["code"]) == (EXIT_STATUS["DELEGATED_CALLER"], "DELEGATED_CALLER")


async def test_timeout_withdraws_and_exits_with_ask_timed_out(make_broker, redis_server, namespace):
    broker = await make_broker()
    async with broker.provider("p") as provider:
        asking = asyncio.create_task(
            run_qbroker("ask", "-q", "?", "--timeout", "1", url=redis_server.url, namespace=namespace)
        )
        pending = await asyncio.wait_for(anext(aiter(provider)), 15)
        status, _, err = await asyncio.wait_for(asking, 15)
        await asyncio.wait_for(pending.withdrawn.wait(), 5)  # the UI is told to take it down
    assert (status, json.loads(err)["code"]) == (EXIT_STATUS["ASK_TIMED_OUT"], "ASK_TIMED_OUT")


async def test_redis_unreachable_is_broker_unavailable(namespace):
    status, _, err = await run_qbroker("ask", "-q", "?", url="redis://127.0.0.1:1/0", namespace=namespace)
    assert (status, json.loads(err.splitlines()[-1])["code"]) == (
        EXIT_STATUS["BROKER_UNAVAILABLE"],
        "BROKER_UNAVAILABLE",
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_interrupt_withdraws_the_question(make_broker, redis_server, namespace, sig):
    broker = await make_broker()
    async with broker.provider("p") as provider:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers", "ask", "-q", "Wait?",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env_for(redis_server.url, namespace),
        )  # fmt: skip
        pending = await asyncio.wait_for(anext(aiter(provider)), 15)
        process.send_signal(sig)
        out, err = await asyncio.wait_for(process.communicate(), 15)
        await asyncio.wait_for(pending.withdrawn.wait(), 5)
        with pytest.raises(UserQuestionError) as refused:
            await pending.answer(answer(("q1", (), "too late")))
    assert refused.value.code == "NOT_PENDING"
    assert (process.returncode, out) == (EXIT_STATUS["ASK_ABORTED"], b"")
    assert json.loads(err)["code"] == "ASK_ABORTED"


def test_request_decoding_matches_the_library():
    data = b'{"questions": [{"id": "q", "question": "?", "multiSelect": true}]}'
    assert msgspec.json.decode(data, type=AskUserQuestionRequest).questions[0].multi_select


async def test_a_bad_database_index_is_broker_unavailable_at_once(redis_server, namespace):
    """Issue 11 case 13: it hung for good (ignoring --timeout, SIGTERM and Ctrl-C)."""
    started = time.monotonic()
    status, _, err = await run_qbroker(
        "ask", "-q", "?", "--timeout", "5", url=f"redis://127.0.0.1:{redis_server.port}/99", namespace=namespace
    )
    assert (status, json.loads(err.splitlines()[-1])["code"]) == (
        EXIT_STATUS["BROKER_UNAVAILABLE"],
        "BROKER_UNAVAILABLE",
    )
    assert time.monotonic() - started < 5


async def test_request_with_question_is_a_usage_error(redis_server, namespace):
    """Issue 16: `-r` with `-q` exited 4 (BAD_REQUEST) instead of argparse's usage error."""
    status, out, err = await run_qbroker("ask", "-r", "-", "-q", "Go?", url=redis_server.url, namespace=namespace)
    assert (status, out) == (2, b"") and b"not allowed with argument" in err


async def test_priority_and_no_coalesce_reach_the_provider(make_broker, redis_server, namespace):
    provider_broker = await make_broker()
    ask = ("ask", "-q", "Restart the cluster?", "-o", "yes", "-o", "no", "--priority", "urgent")
    async with provider_broker.provider("test-provider") as provider:
        asks = [
            asyncio.create_task(run_qbroker(*ask, url=redis_server.url, namespace=namespace)),
            asyncio.create_task(run_qbroker(*ask, "--no-coalesce", url=redis_server.url, namespace=namespace)),
        ]
        cards = [await asyncio.wait_for(anext(aiter(provider)), 15) for _ in asks]
        assert [(card.priority, len(card.askers)) for card in cards] == [("urgent", 1), ("urgent", 1)]
        for card in cards:
            await card.answer(answer(("q1", ("yes",), None)))
        for status, out, err in await asyncio.wait_for(asyncio.gather(*asks), 15):
            assert status == 0, err
            assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["yes"]}]}


@pytest.mark.timeout(45)
async def test_a_remembered_answer_is_told_from_a_human_one(make_broker, redis_server, namespace):
    """Issue 26, item 7: `qbroker ask` printed a remembered answer exactly as a human's."""
    from broker import Remember

    async def respond(pending):
        await pending.answer(answer(("q1", ("yes",), None)), by="alice", remember=Remember())

    args = ("--question", "Deploy?", "--id", "q1", "--option", "yes", "--option", "no")
    _, status, out, err = await _ask_answered_by(make_broker, redis_server, namespace, respond, *args)
    assert status == 0 and b"remembered" not in err, err  # a human answered this one
    provider_broker = await make_broker()
    async with provider_broker.provider("test-provider"):  # a provider must be up for the ask to be taken
        status, again, err = await run_qbroker("ask", *args, url=redis_server.url, namespace=namespace)
    assert status == 0 and again == out, err  # the same answer on stdout
    assert b"answered by a remembered decision set by alice" in err, err
