"""``qbroker claude-hook`` as Claude Code runs it: a PreToolUse payload on stdin, a decision on stdout."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, Remember
from tests.workers.procs import run_qbroker
from workers.redis_server import free_port

# Shaped as Claude Code's hooks reference documents a PreToolUse input.
BASH = {
    "session_id": "abc123",
    "transcript_path": "/home/u/.claude/projects/p/abc123.jsonl",
    "cwd": "/home/u/project",
    "permission_mode": "default",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {"command": "rm -rf build", "description": "Remove the build directory"},
    "tool_use_id": "toolu_01ABC",
}
EDIT = {
    **BASH,
    "tool_name": "Edit",
    "tool_input": {"file_path": "/home/u/project/app.py", "old_string": "x = 1", "new_string": "x = 2"},
    "tool_use_id": "toolu_02DEF",
}
MCP = {**BASH, "tool_name": "mcp__github__create_issue", "tool_input": {"title": "Bug", "body": "It `breaks`"}}


def _decision(out: bytes) -> tuple[str, str]:
    output = json.loads(out)["hookSpecificOutput"]
    assert output["hookEventName"] == "PreToolUse"
    return output["permissionDecision"], output["permissionDecisionReason"]


async def _hook_answered_by(make_broker, redis_server, namespace, payload, respond, *args: str):
    broker = await make_broker()
    async with broker.provider("test-provider") as provider:
        hooking = asyncio.create_task(
            run_qbroker(
                "claude-hook", *args, url=redis_server.url, namespace=namespace, stdin=json.dumps(payload).encode()
            )
        )
        delivery = asyncio.ensure_future(anext(aiter(provider)))
        await asyncio.wait({hooking, delivery}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        if not delivery.done():
            delivery.cancel()
            raise AssertionError(f"not delivered; the hook ended with {hooking.result() if hooking.done() else None}")
        pending = delivery.result()
        await respond(pending)
        status, out, err = await asyncio.wait_for(hooking, 15)
    assert status == 0, err
    return pending.request, _decision(out)


def _reply(selected: tuple[str, ...] = (), custom: str | None = None) -> Any:
    async def respond(pending: Any) -> None:
        item = AskUserQuestionAnswerItem(id="permission", selected=selected, custom=custom)
        await pending.answer(AskUserQuestionAnswer(answers=(item,)), by="alice")

    return respond


@pytest.mark.parametrize(
    ("payload", "question", "in_detail"),
    [
        pytest.param(BASH, "Allow Bash: `rm -rf build`?", "Remove the build directory", id="bash"),
        pytest.param(EDIT, "Allow Edit: `/home/u/project/app.py`?", '"new_string": "x = 2"', id="edit"),
        pytest.param(MCP, "Allow mcp__github__create_issue: `{\"body\": \"It 'breaks'\", \"title\": \"Bug\"}`?",
                     '"title": "Bug"', id="mcp-tool"),
    ],
)  # fmt: skip
async def test_allow(make_broker, redis_server, namespace, payload, question, in_detail):
    request, decision = await _hook_answered_by(make_broker, redis_server, namespace, payload, _reply(("Allow",)))
    item = request.questions[0]
    assert (item.question, item.header, item.labels, item.multi_select) == (
        question, "Claude Code", ("Allow", "Deny"), False,
    )  # fmt: skip
    assert in_detail in (item.detail or "") and "/home/u/project" in (item.detail or "")
    assert request.agent == f"claude-code-{payload['tool_use_id']}"  # a live root: withdrawn if the hook dies
    assert decision == ("allow", "allowed by the user through question-broker")


async def test_deny(make_broker, redis_server, namespace):
    _, decision = await _hook_answered_by(make_broker, redis_server, namespace, BASH, _reply(("Deny",)))
    assert decision == ("deny", "denied by the user through question-broker")


async def test_a_note_denies_and_tells_claude_why(make_broker, redis_server, namespace):
    _, decision = await _hook_answered_by(
        make_broker, redis_server, namespace, BASH, _reply(custom="use `make clean` instead")
    )
    assert decision == ("deny", "The user says: use `make clean` instead")


async def test_a_cancelled_question_denies(make_broker, redis_server, namespace):
    async def cancel(pending: Any) -> None:
        await pending.cancel("not during the release", by="alice")

    _, decision = await _hook_answered_by(make_broker, redis_server, namespace, BASH, cancel)
    assert decision[0] == "deny" and "not during the release" in decision[1]


async def test_a_skipped_question_falls_back_to_the_local_prompt(make_broker, redis_server, namespace):
    _, decision = await _hook_answered_by(make_broker, redis_server, namespace, BASH, _reply())
    assert decision[0] == "ask"


@pytest.mark.parametrize(
    ("args", "expected"),
    [pytest.param((), "ask", id="default-ask"), pytest.param(("--on-unavailable", "deny"), "deny", id="deny")],
)
async def test_no_provider_falls_back(redis_server, namespace, args, expected):
    status, out, err = await run_qbroker(
        "claude-hook", *args, url=redis_server.url, namespace=namespace, stdin=json.dumps(BASH).encode()
    )
    assert status == 0, err
    decision, reason = _decision(out)
    assert (decision, "NO_PROVIDER" in reason) == (expected, True)


async def test_a_timeout_falls_back(make_broker, redis_server, namespace):
    broker = await make_broker()
    async with broker.provider("silent"):  # holds the lease, never answers
        status, out, err = await run_qbroker(
            "claude-hook", "--timeout", "0.5", url=redis_server.url, namespace=namespace,
            stdin=json.dumps(BASH).encode(),
        )  # fmt: skip
    assert status == 0, err
    decision, reason = _decision(out)
    assert decision == "ask" and "ASK_TIMED_OUT" in reason


async def test_redis_unreachable_falls_back(namespace):
    status, out, err = await run_qbroker(
        "claude-hook", url=f"redis://127.0.0.1:{free_port()}/0", namespace=namespace, stdin=json.dumps(BASH).encode()
    )
    assert status == 0, err
    decision, reason = _decision(out)
    assert decision == "ask" and "BROKER_UNAVAILABLE" in reason


@pytest.mark.parametrize("stdin", [b"not json", b"{}", b'{"tool_name": 3}'], ids=["not-json", "empty", "bad-name"])
async def test_a_payload_it_cannot_read_falls_back(redis_server, namespace, stdin):
    status, out, err = await run_qbroker("claude-hook", url=redis_server.url, namespace=namespace, stdin=stdin)
    assert status == 0, err
    assert _decision(out)[0] == "ask" and b"not a PreToolUse payload" in err


def _remember_allow() -> Any:
    async def respond(pending: Any) -> None:
        item = AskUserQuestionAnswerItem(id="permission", selected=("Allow",))
        remember = Remember() if pending.can_remember(AskUserQuestionAnswer(answers=(item,))) else None
        await pending.answer(AskUserQuestionAnswer(answers=(item,)), by="alice", remember=remember)

    return respond


async def test_with_remember_a_remembered_allow_answers_the_same_call_in_the_same_directory(
    make_broker, redis_server, namespace
):
    request, decision = await _hook_answered_by(
        make_broker, redis_server, namespace, BASH, _remember_allow(), "--remember"
    )
    assert request.questions[0].question == "Allow Bash: `rm -rf build` in `/home/u/project`?"
    assert decision[0] == "allow"

    async def hook(payload: dict[str, Any], *args: str) -> tuple[str, str]:
        status, out, err = await run_qbroker(
            "claude-hook", *args, url=redis_server.url, namespace=namespace, stdin=json.dumps(payload).encode()
        )
        assert status == 0, err
        return _decision(out)

    # no provider now: the remembered decision answers the same call (another tool_use_id) at once...
    assert (await hook({**BASH, "tool_use_id": "toolu_09"}, "--remember"))[0] == "allow"
    # ...but not without --remember, nor in another directory, nor another command
    assert "NO_PROVIDER" in (await hook({**BASH, "tool_use_id": "toolu_10"}))[1]
    assert "NO_PROVIDER" in (await hook({**BASH, "cwd": "/etc"}, "--remember"))[1]
    other = {**BASH, "tool_input": {"command": "rm -rf build/../.."}}
    assert "NO_PROVIDER" in (await hook(other, "--remember"))[1]


@pytest.mark.parametrize(
    ("payload", "whole"),
    [
        pytest.param(BASH, True, id="bash"),
        pytest.param(EDIT, False, id="edit-has-more-input"),
        pytest.param(MCP, False, id="no-subject"),
        pytest.param({**BASH, "tool_input": {"command": "echo " + "x" * 300}}, False, id="truncated"),
        pytest.param({**BASH, "tool_input": {"command": "echo a\n  rm -rf /"}}, False, id="multi-line"),
    ],
)
def test_only_a_call_the_question_names_whole_may_be_remembered(payload, whole):
    from workers.claude_hook import HookPayload, names_the_whole_call

    assert names_the_whole_call(msgspec.convert(payload, HookPayload)) is whole
