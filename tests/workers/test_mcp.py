"""``qbroker mcp`` driven by the SDK's own MCP client over stdio, against a real Redis.

The provider answering the questions is an automatic one running in the test process
(``Broker.provider()``), so every test sees both ends of the question.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import os
import socket
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    Broker,
    PendingRequest,
    PlanReviewIntent,
    Remember,
    UserQuestionError,
)
from broker.types import convert_request
from tests.helpers import KEYS, SIGNING_KEY, pick, plan_review_arguments, serving
from tests.redis_server import RedisServer
from workers.asking.mcp.tool import OUTPUT_SCHEMA, parse_arguments

pytestmark = pytest.mark.slow

Policy = Callable[[PendingRequest], Awaitable[None]]


@contextlib.asynccontextmanager
async def mcp_client(
    redis_server: RedisServer, namespace: str, *args: str, client_name: str = "test-client"
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "workers.asking.mcp.command",
            "--redis-url",
            redis_server.url,
            "--namespace",
            namespace,
            *args,
        ],
        env={
            **get_default_environment(),
            "QBROKER_TRUSTED_KEYS": SIGNING_KEY.public_text,
        },  # as a client config sets it
    )
    async with (
        stdio_client(params) as (read_stream, write_stream),
        ClientSession(
            read_stream, write_stream, client_info=types.Implementation(name=client_name, version="1.0")
        ) as session,
    ):
        await session.initialize()
        yield session


_shared_namespaces = itertools.count()
_T = TypeVar("_T")


class SharedClient:
    """One ``qbroker mcp`` process over stdio that several tests ask through, each with its own provider.

    The SDK's import costs every server process about 1 s of CPU, and most tests here need a server, not a
    fresh one: those that start, stop, restart or re-identify it (or give it flags of their own) keep one to
    themselves. The session is the module's while the tests' event loops are each test's, so it runs on a
    loop of its own in a thread, and each request is handed over to that loop (a cancelled call is cancelled
    there too: the client sends notifications/cancelled). Its namespace is its own, for the tests' providers.
    """

    def __init__(self, client: Callable[[SharedClient], AbstractAsyncContextManager[ClientSession]]) -> None:
        self.namespace = f"t{os.getpid()}-mcp{next(_shared_namespaces)}"
        self.elicit: Callable[[Any, types.ElicitRequestParams], Awaitable[types.ElicitResult]] | None = None
        """what the client answers an elicitation with (an eliciting client's), set by each test"""
        self._client = client
        self._loop = asyncio.new_event_loop()
        self._ready: concurrent.futures.Future[ClientSession] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),), daemon=True)

    def __enter__(self) -> SharedClient:
        self._thread.start()
        self._session = self._ready.result(timeout=30)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with self._client(self) as session:
                self._ready.set_result(session)
                await self._stop.wait()
        except BaseException as error:
            if not self._ready.done():
                self._ready.set_exception(error)
            raise

    async def _there(self, call: Coroutine[Any, Any, _T]) -> _T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, self._loop))

    async def call_tool(self, name: str, arguments: dict[str, Any], **options: Any) -> types.CallToolResult:
        return await self._there(self._session.call_tool(name, arguments, **options))

    async def list_tools(self) -> types.ListToolsResult:
        return await self._there(self._session.list_tools())

    async def elicited(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert self.elicit is not None, "the test set no answer to an elicitation"
        return await self.elicit(context, params)


@pytest.fixture(scope="module")
def shared(redis_server: RedisServer) -> Iterator[SharedClient]:
    """A ``qbroker mcp`` that asks for progress every 0.3 s, with the client named test-client."""
    with SharedClient(lambda it: mcp_client(redis_server, it.namespace, "--progress-interval", "0.3")) as client:
        yield client


@pytest.fixture(scope="module")
def eliciting(redis_server: RedisServer) -> Iterator[SharedClient]:
    """A ``qbroker mcp`` whose client (named local) answers elicitations with the test's ``elicit``."""
    with SharedClient(lambda it: eliciting_client(redis_server, it.namespace, it.elicited)) as client:
        yield client


def provider(broker: Broker, policy: Policy | None) -> AbstractAsyncContextManager[asyncio.Queue[PendingRequest]]:
    """An automatic provider: every delivered request is queued, then handed to ``policy``."""
    return serving(broker, "test-auto", policy)


async def pick_first(pending: PendingRequest) -> None:
    items = tuple(AskUserQuestionAnswerItem(id=q.id, selected=q.labels[:1]) for q in pending.request.questions)
    await pending.answer(AskUserQuestionAnswer(answers=items), by="test")


async def dismiss(pending: PendingRequest) -> None:
    await pending.cancel("not now", by="test")


def structured(result: types.CallToolResult) -> Any:
    """The structured content, checked to say the same as the text content and to fit the tool's outputSchema.

    Every result, an error too: the specification says structured results conform to the output schema,
    and the official TypeScript client validates ``structuredContent`` whenever it is present (a result
    that does not fit is a -32602 protocol error there, not the coded failure). The Python client checks
    successful results only, so this check is the TypeScript client's.
    """
    assert len(result.content) == 1
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    assert json.loads(text.text) == result.structured_content
    jsonschema.Draft202012Validator(OUTPUT_SCHEMA).validate(result.structured_content)
    return result.structured_content


YES_NO = {"questions": [{"id": "deploy", "question": "Deploy now?", "options": [{"label": "yes"}, {"label": "no"}]}]}


async def test_lists_the_tool_with_the_request_schema(shared: SharedClient) -> None:
    listed = await shared.list_tools()
    [tool] = listed.tools
    assert tool.name == "ask_user_question"
    item = tool.input_schema["properties"]["questions"]["items"]["properties"]
    assert {"id", "question", "detail", "header", "options", "multiSelect", "intent"} <= set(item)


async def test_plain_question_is_answered_as_a_live_root_agent(
    shared: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker(namespace=shared.namespace)
    async with provider(broker, pick_first) as seen:
        result = await shared.call_tool("ask_user_question", YES_NO)
        pending = seen.get_nowait()
    assert not result.is_error
    assert structured(result) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}
    assert pending.agent_id is not None and pending.agent_id.startswith("mcp-test-client-")


async def test_batch_in_the_coding_agent_shape_maps_generated_ids_back(
    shared: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    async def answer_batch(pending: PendingRequest) -> None:
        first, second = pending.request.questions
        assert first.multi_select and not second.multi_select
        assert first.header == "Stack"
        await pending.answer(
            AskUserQuestionAnswer(
                answers=(
                    AskUserQuestionAnswerItem(id=first.id, selected=("redis", "postgres")),
                    AskUserQuestionAnswerItem(id=second.id, selected=(), custom="next week"),
                )
            )
        )

    arguments = {
        "questions": [
            {
                "question": "Which stores?",
                "header": "Stack",
                "options": [{"label": "redis", "description": "fast"}, "postgres", "sqlite"],
                "multi_select": True,
            },
            {"question": "When?", "options": ["today", "tomorrow"], "multiSelect": False},
        ]
    }
    broker = await make_broker(namespace=shared.namespace)
    async with provider(broker, answer_batch):
        result = await shared.call_tool("ask_user_question", arguments)
    assert not result.is_error, result
    assert structured(result) == {
        "answers": [
            {"id": "q1", "selected": ["redis", "postgres"], "question": "Which stores?"},
            {"id": "q2", "selected": [], "custom": "next week", "question": "When?"},
        ]
    }


async def test_plan_review_reaches_the_provider_with_its_intent(
    shared: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    async def approve(pending: PendingRequest) -> None:
        [item] = pending.request.questions
        assert isinstance(item.intent, PlanReviewIntent)
        assert item.detail == "# Plan\n1. migrate"
        await pending.answer(
            AskUserQuestionAnswer(answers=(AskUserQuestionAnswerItem(id=item.id, selected=(item.intent.approve,)),))
        )

    arguments = plan_review_arguments("Approve the plan?", "# Plan\n1. migrate", ("Ship it", "Rework"), "Ship it")
    broker = await make_broker(namespace=shared.namespace)
    async with provider(broker, approve):
        result = await shared.call_tool("ask_user_question", arguments)
    assert structured(result) == {"answers": [{"id": "plan", "selected": ["Ship it"]}]}


BAD_CALLS: dict[str, dict[str, Any]] = {
    "EMPTY_QUESTIONS": {"questions": []},
    "BAD_INTENT": plan_review_arguments("Approve?", "the plan", ("Yes", "No"), approve="Approve"),
    "BAD_REQUEST": {"questions": [{"id": "a", "question": "one?"}, {"id": "a", "question": "two?"}]},
}


async def test_invalid_calls_fail_with_their_codes(
    shared: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker(namespace=shared.namespace)
    calls: list[tuple[str, dict[str, Any]]] = [
        *BAD_CALLS.items(),
        ("BAD_REQUEST", {"questions": "not a list"}),
        ("BAD_REQUEST", {}),
    ]
    async with provider(broker, pick_first) as seen:
        for code, arguments in calls:
            result = await shared.call_tool("ask_user_question", arguments)
            assert result.is_error, (code, result)
            error = structured(result)
            assert (error["name"], error["code"]) == ("UserQuestionError", code), arguments
            assert error["message"]
        assert seen.empty()  # nothing invalid reached the provider


async def test_no_provider(shared: SharedClient) -> None:
    result = await shared.call_tool("ask_user_question", YES_NO)
    assert result.is_error
    assert structured(result)["code"] == "NO_PROVIDER"


async def test_a_remembered_decision_answers_the_tool_unless_it_says_remember_false(
    redis_server: RedisServer, namespace: str, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker()

    async def remember_yes(pending: PendingRequest) -> None:
        await pending.answer(pick("yes", "deploy"), by="alice", remember=Remember())

    async with provider(broker, remember_yes):
        await broker.ask(convert_request(YES_NO), timeout=10)
    async with mcp_client(redis_server, namespace) as session:  # no provider now
        decided = await session.call_tool("ask_user_question", YES_NO)
        opted_out = await session.call_tool("ask_user_question", {**YES_NO, "remember": False})
    assert structured(decided) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}
    assert opted_out.is_error and structured(opted_out)["code"] == "NO_PROVIDER"


async def test_dismissed_and_timed_out_questions(
    shared: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    async def dismiss_first_only(pending: PendingRequest) -> None:
        if pending.request.questions[0].id == "dismiss-me":
            await dismiss(pending)

    broker = await make_broker(namespace=shared.namespace)
    dismissed = {"questions": [{"id": "dismiss-me", "question": "Really?"}]}
    ignored = {"questions": [{"id": "ignore-me", "question": "Anyone?"}], "timeoutSeconds": 0.5}
    async with provider(broker, dismiss_first_only) as seen:
        cancelled = await shared.call_tool("ask_user_question", dismissed)
        timed_out = await shared.call_tool("ask_user_question", ignored)
        await seen.get()
        shown = await seen.get()
        await asyncio.wait_for(shown.withdrawn.wait(), 10)  # the UI is told to take it down
    assert structured(cancelled) == {"name": "UserQuestionError", "code": "ASK_CANCELLED", "message": "not now"}
    assert structured(timed_out)["code"] == "ASK_TIMED_OUT"


async def test_another_instance_taking_the_agent_id(
    redis_server: RedisServer, namespace: str, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker()
    async with provider(broker, pick_first), mcp_client(redis_server, namespace, "--agent-id", "shared") as session:
        first = await session.call_tool("ask_user_question", YES_NO)
        async with broker.agent("shared", restart=True):  # a restarted instance replaces the server's
            second = await session.call_tool("ask_user_question", YES_NO)
    assert not first.is_error
    assert structured(second)["code"] == "CALLER_NOT_LIVE"


async def test_cancelled_call_withdraws_the_question(
    shared: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker(namespace=shared.namespace)
    async with provider(broker, None) as seen:
        call = asyncio.create_task(shared.call_tool("ask_user_question", YES_NO))
        pending = await asyncio.wait_for(seen.get(), 20)
        call.cancel()  # the client sends notifications/cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await asyncio.wait_for(pending.withdrawn.wait(), 10)
        after = await shared.call_tool("ask_user_question", {"questions": []})
        assert structured(after)["code"] == "EMPTY_QUESTIONS"  # the server still serves


async def test_client_going_away_withdraws_the_question(
    redis_server: RedisServer, namespace: str, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker()
    async with provider(broker, None) as seen:
        call: asyncio.Task[types.CallToolResult] | None = None
        async with mcp_client(redis_server, namespace) as session:
            call = asyncio.create_task(session.call_tool("ask_user_question", YES_NO))
            pending = await asyncio.wait_for(seen.get(), 20)
        # Leaving the block closed the server's stdin mid-question: the server withdrew it.
        await asyncio.wait_for(pending.withdrawn.wait(), 10)
        with contextlib.suppress(Exception):
            await call


async def test_streamable_http_transport(
    redis_server: RedisServer, namespace: str, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    process, port = await _start_http(redis_server, namespace)
    try:
        broker = await make_broker()
        async with (
            provider(broker, pick_first),
            streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read_stream, write_stream, *_),
            ClientSession(
                read_stream, write_stream, client_info=types.Implementation(name="http-client", version="1")
            ) as session,
        ):
            await session.initialize()
            result = await session.call_tool("ask_user_question", YES_NO)
        assert structured(result) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 20) == 0


def test_generated_ids_avoid_the_callers_own() -> None:
    parsed = parse_arguments(
        {"questions": [{"question": "first?"}, {"id": "q1", "question": "named?"}, {"question": "third?"}]}
    )
    assert [q.id for q in parsed.request.questions] == ["q1_", "q1", "q3"]
    assert parsed.generated == {"q1_": "first?", "q3": "third?"}


@pytest.mark.parametrize(
    ("fields", "multi"),
    [
        ({}, False),
        ({"multiSelect": True}, True),
        ({"multi_select": True}, True),
        ({"multiSelect": False, "multi_select": True}, False),
    ],
    ids=["absent", "camel", "snake", "camel-wins"],
)
def test_multi_select_spelled_either_way(fields: dict[str, Any], multi: bool) -> None:
    [item] = parse_arguments({"questions": [{"id": "q", "question": "?", **fields}]}).request.questions
    assert item.multi_select is multi


def test_priority_and_coalesce_reach_the_ask() -> None:
    parsed = parse_arguments({**YES_NO, "priority": "urgent", "coalesce": False})
    assert (parsed.request.priority, parsed.coalesce) == ("urgent", False)
    default = parse_arguments(YES_NO)
    assert (default.request.priority, default.coalesce) == ("normal", True)


@pytest.mark.parametrize(
    "arguments",
    [{"questions": [{"id": "q", "question": "?"}], "timeoutSeconds": 0}, {"questions": [{"id": 3, "question": "?"}]}],
    ids=["zero-timeout", "numeric-id"],
)
def test_malformed_arguments_are_bad_requests(arguments: dict[str, Any]) -> None:
    with pytest.raises(UserQuestionError) as caught:
        parse_arguments(arguments)
    assert caught.value.code == "BAD_REQUEST"


@pytest.mark.timeout(60)
async def test_started_while_redis_is_down_it_serves_and_recovers(redis_factory, namespace: str) -> None:
    """Issue 11 case 13: the server answers initialize and fails each call with a coded error
    while Redis is down, then asks normally once Redis is up."""
    server = redis_factory()
    server.kill()
    async with mcp_client(server, namespace) as session:
        result = await asyncio.wait_for(session.call_tool("ask_user_question", YES_NO), 15)
        assert result.is_error
        assert structured(result)["code"] == "BROKER_UNAVAILABLE"
        await asyncio.to_thread(server.start)
        async with Broker(server.url, namespace, **KEYS) as broker, provider(broker, pick_first):
            for _ in range(20):  # the server re-opens its broker within a few seconds
                result = await asyncio.wait_for(session.call_tool("ask_user_question", YES_NO), 15)
                if not result.is_error:
                    break
                assert structured(result)["code"] == "BROKER_UNAVAILABLE"
                await asyncio.sleep(0.5)
    assert structured(result) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}


async def test_a_keyed_call_outlives_the_server_and_a_restarted_one_gets_the_answer(
    redis_server: RedisServer, namespace: str, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker()
    keyed = {**YES_NO, "key": "deploy-2.4.0"}
    async with provider(broker, None) as seen:
        call: asyncio.Task[types.CallToolResult] | None = None
        async with mcp_client(redis_server, namespace, "--agent-id", "coder") as session:
            call = asyncio.create_task(session.call_tool("ask_user_question", keyed))
            pending = await asyncio.wait_for(seen.get(), 20)
        with contextlib.suppress(Exception):
            await call
        async with asyncio.timeout(10):  # the server went away: the question is kept, its asker away
            while not pending.asker_away:
                await asyncio.sleep(0.05)
        assert not pending.withdrawn.is_set()
        await pick_first(pending)
        async with mcp_client(redis_server, namespace, "--agent-id", "coder") as session:
            again = await session.call_tool("ask_user_question", keyed)
    assert structured(again) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}
    assert seen.empty()  # no second card


def test_a_key_must_be_a_string() -> None:
    assert parse_arguments({**YES_NO, "key": "k"}).key == "k"
    with pytest.raises(UserQuestionError):
        parse_arguments({**YES_NO, "key": 7})


# -- what MCP clients expect: an output schema, progress, protocol errors, elicitation ------------


async def test_the_tool_declares_its_output_schema(shared: SharedClient) -> None:
    [tool] = (await shared.list_tools()).tools
    schema = tool.output_schema
    assert schema == OUTPUT_SCHEMA  # what structured() checks every result against
    answer, failure = schema["oneOf"]
    assert answer["required"] == ["answers"] and failure["required"] == ["name", "code", "message"]
    item = schema["properties"]["answers"]["items"]
    assert set(item["properties"]) == {"id", "selected", "custom", "question"}
    jsonschema.Draft202012Validator.check_schema(schema)


async def test_an_unknown_tool_is_a_protocol_error(shared: SharedClient) -> None:
    with pytest.raises(MCPError) as caught:
        await shared.call_tool("no_such_tool", {})
    assert caught.value.code == types.INVALID_PARAMS and "no_such_tool" in caught.value.message
    assert structured(await shared.call_tool("ask_user_question", {"questions": []}))["code"] == "EMPTY_QUESTIONS"


async def test_progress_is_reported_while_a_human_takes_their_time(
    shared: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    reports: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        reports.append((progress, total, message))

    async def slow(pending: PendingRequest) -> None:
        await asyncio.sleep(1.5)
        await pick_first(pending)

    broker = await make_broker(namespace=shared.namespace)
    async with provider(broker, slow):  # the shared server reports progress every 0.3 s
        arguments = {**YES_NO, "timeoutSeconds": 60}
        result = await asyncio.wait_for(
            shared.call_tool("ask_user_question", arguments, progress_callback=on_progress), 20
        )
        silent = await asyncio.wait_for(
            shared.call_tool("ask_user_question", YES_NO), 20
        )  # no progressToken: waits all the same
    assert structured(result) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}
    assert not silent.is_error
    assert len(reports) >= 2, reports
    assert [p for p, _, _ in reports] == sorted({p for p, _, _ in reports})  # strictly increasing
    assert all(total == 60 for _, total, _ in reports)
    assert "waiting for a human" in (reports[0][2] or "")


async def _elicit_answering(
    content: dict[str, Any] | None, action: str = "accept", seen: list[Any] | None = None
) -> Any:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if seen is not None:
            seen.append(params)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return elicit


@contextlib.asynccontextmanager
async def eliciting_client(redis_server: RedisServer, namespace: str, elicit: Any) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers.asking.mcp.command", "--redis-url", redis_server.url, "--namespace", namespace],
        env={**get_default_environment(), "QBROKER_TRUSTED_KEYS": SIGNING_KEY.public_text},
    )
    async with (
        stdio_client(params) as (read_stream, write_stream),
        ClientSession(
            read_stream, write_stream, elicitation_callback=elicit,
            client_info=types.Implementation(name="local", version="1"),
        ) as session,
    ):  # fmt: skip
        await session.initialize()
        yield session


BATCH = {
    "questions": [
        {"id": "deploy", "question": "Deploy now?", "header": "Release", "options": ["yes", "no"]},
        {"id": "checks", "question": "Which checks?", "options": ["lint", "types", "tests"], "multiSelect": True},
        {"id": "note", "question": "Anything else?"},
    ]
}


async def test_no_provider_asks_the_local_user_through_elicitation(eliciting: SharedClient) -> None:
    seen: list[Any] = []
    content = {"deploy": "no", "checks": ["lint", "tests"], "note": "ship on Monday"}
    eliciting.elicit = await _elicit_answering(content, seen=seen)
    result = await eliciting.call_tool("ask_user_question", BATCH)
    assert not result.is_error, result
    assert structured(result) == {
        "answers": [
            {"id": "deploy", "selected": ["no"]},
            {"id": "checks", "selected": ["lint", "tests"]},
            {"id": "note", "selected": [], "custom": "ship on Monday"},
        ]
    }
    [params] = seen
    assert "Deploy now?" in params.message and "Which checks?" in params.message
    properties = params.requested_schema["properties"]
    assert properties["deploy"]["enum"] == ["yes", "no"]
    assert properties["checks"]["items"]["enum"] == ["lint", "types", "tests"]
    assert properties["note"]["type"] == "string"


async def test_elicitation_typed_text_and_skips(eliciting: SharedClient) -> None:
    eliciting.elicit = await _elicit_answering({"deploy_other": "after the freeze"})
    result = await eliciting.call_tool("ask_user_question", BATCH)
    assert structured(result) == {
        "answers": [
            {"id": "deploy", "selected": [], "custom": "after the freeze"},
            {"id": "checks", "selected": []},
            {"id": "note", "selected": []},
        ]
    }


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_a_declined_elicitation_is_a_dismissed_question(eliciting: SharedClient, action: str) -> None:
    eliciting.elicit = await _elicit_answering(None, action)
    result = await eliciting.call_tool("ask_user_question", YES_NO)
    assert result.is_error and structured(result)["code"] == "ASK_CANCELLED"


async def test_with_a_provider_the_team_answers_not_the_local_user(
    eliciting: SharedClient, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    seen: list[Any] = []
    eliciting.elicit = await _elicit_answering({"deploy": "no"}, seen=seen)
    broker = await make_broker(namespace=eliciting.namespace)
    async with provider(broker, pick_first):
        result = await eliciting.call_tool("ask_user_question", YES_NO)
    assert structured(result) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}
    assert seen == []


async def _start_http(redis_server: RedisServer, namespace: str, *args: str) -> tuple[asyncio.subprocess.Process, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "workers.asking.mcp.command", "--transport", "http", "--port", str(port), *args),
        *("--redis-url", redis_server.url, "--namespace", namespace),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "QBROKER_LOG_LEVEL": "INFO"},
    )
    assert process.stderr is not None
    while b"Uvicorn running on" not in (line := await asyncio.wait_for(process.stderr.readline(), 20)):
        assert line, "the server exited before listening"
    return process, port


@pytest.mark.timeout(40)
async def test_http_with_tokens_needs_a_bearer_token_and_asks_as_its_agent(
    redis_server: RedisServer, namespace: str, make_broker: Callable[..., Awaitable[Broker]], tmp_path: Path
) -> None:
    """Attack 11: over HTTP with --tokens-file, no token is 401, and the token (not --agent-id) names the agent."""
    import httpx
    import httpx2

    from workers.asking.gateway.tokens import new_token

    tokens = tmp_path / "tokens"
    token = new_token(tokens, "claude-alice")
    process, port = await _start_http(
        redis_server, namespace, "--tokens-file", str(tokens), "--agent-id", "configured-agent"
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        async with httpx.AsyncClient(timeout=10) as anonymous:
            for headers in ({}, {"authorization": "Bearer qbgt1_forged"}):
                refused = await anonymous.post(url, json=initialize, headers=headers)
                assert refused.status_code == 401 and refused.json()["error"]["code"] == "UNAUTHENTICATED"
        broker = await make_broker()
        async with (
            provider(broker, pick_first) as seen,
            httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=30) as authorised,
            streamable_http_client(url, http_client=authorised) as (read_stream, write_stream, *_),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            result = await session.call_tool("ask_user_question", YES_NO)
            assert seen.get_nowait().request.agent == "claude-alice"
        assert structured(result) == {"answers": [{"id": "deploy", "selected": ["yes"]}]}
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 20) == 0


@pytest.mark.timeout(30)
async def test_http_refuses_to_listen_beyond_loopback_without_tokens(redis_server: RedisServer, namespace: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "workers", "mcp", "--transport", "http", "--host", "0.0.0.0", "--port", "0"),
        *("--redis-url", redis_server.url, "--namespace", namespace),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 21 and b"NO_TOKENS" in err
