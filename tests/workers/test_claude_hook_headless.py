"""``qbroker claude-hook`` in a headless Claude Code session (``claude -p``, the Agent SDK).

Claude Code's hooks reference: in a session that cannot show a prompt, a PermissionRequest that no hook
decides is denied, with no reason the model can read. So where the interactive answer is "no decision:
Claude Code asks locally", a headless session gets a deny whose message is the coded reason (or, with
``--headless wait``, the hook keeps asking the team until its timeout). Claude Code tells its hooks how it
was started in ``CLAUDE_CODE_ENTRYPOINT`` (``cli`` in a terminal; ``sdk-cli``, ``sdk-py``, ``sdk-ts`` headless).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem
from tests.workers.procs import env_for
from tests.workers.test_claude_hook import BASH, QUESTIONS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(40)]


async def hook(
    redis_server: Any, namespace: str, payload: dict[str, Any], *args: str, entrypoint: str | None
) -> dict[str, Any]:
    env = env_for(redis_server.url, namespace)
    if entrypoint is not None:
        env["CLAUDE_CODE_ENTRYPOINT"] = entrypoint
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", "claude-hook", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(json.dumps(payload).encode()), 30)
    assert process.returncode == 0, err
    decoded: dict[str, Any] = json.loads(out)
    return decoded


@pytest.mark.parametrize("entrypoint", ["sdk-cli", "sdk-py", "sdk-ts"])
async def test_headless_nobody_to_answer_is_a_deny_with_the_coded_reason(redis_server, namespace, entrypoint):
    output = await hook(redis_server, namespace, BASH, entrypoint=entrypoint)
    decision = output["hookSpecificOutput"]["decision"]
    assert decision["behavior"] == "deny", output
    assert "NO_PROVIDER" in decision["message"] and "headless" in decision["message"], decision


async def test_interactive_nobody_to_answer_still_leaves_it_to_claude_codes_dialog(redis_server, namespace):
    output = await hook(redis_server, namespace, BASH, entrypoint="cli")
    assert "hookSpecificOutput" not in output and "NO_PROVIDER" in output["systemMessage"]


async def test_headless_a_question_nobody_can_answer_is_denied_with_the_reason(redis_server, namespace):
    output = await hook(redis_server, namespace, QUESTIONS, entrypoint="sdk-cli")
    specific = output["hookSpecificOutput"]
    assert specific["permissionDecision"] == "deny", output
    assert "NO_PROVIDER" in specific["permissionDecisionReason"]


async def test_the_session_flag_overrides_what_the_environment_says(redis_server, namespace):
    forced = await hook(redis_server, namespace, BASH, "--session", "headless", entrypoint=None)
    assert forced["hookSpecificOutput"]["decision"]["behavior"] == "deny"
    interactive = await hook(redis_server, namespace, BASH, "--session", "interactive", entrypoint="sdk-cli")
    assert "hookSpecificOutput" not in interactive


async def test_headless_wait_keeps_asking_until_a_provider_comes(make_broker, redis_server, namespace):
    """``--headless wait``: NO_PROVIDER is not the end while the hook's timeout lasts."""
    hooking = asyncio.create_task(
        hook(redis_server, namespace, BASH, "--headless", "wait", "--timeout", "25", entrypoint="sdk-cli")
    )
    await asyncio.sleep(1.5)  # it has met NO_PROVIDER by now
    assert not hooking.done()
    broker = await make_broker()
    async with broker.provider("late-provider") as provider:
        pending = await asyncio.wait_for(anext(aiter(provider)), 20)
        item = AskUserQuestionAnswerItem(id="permission", selected=("Allow",))
        await pending.answer(AskUserQuestionAnswer(answers=(item,)), by="alice")
        output = await asyncio.wait_for(hooking, 20)
    assert output["hookSpecificOutput"]["decision"]["behavior"] == "allow", output
