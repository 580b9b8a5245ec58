"""Each example in examples/ runs as written, offline, against a real `qbroker auto` provider."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path

import pytest

from tests.workers.procs import auto_answering, env_for, run_qbroker
from workers.cli import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RULES = """
[default]
first = true          # Approve / Allow: the first option of every approval question

[[rule]]
intent = "plan-review"
approve = true
"""


@pytest.fixture
async def auto(tmp_path, redis_server, namespace):
    async with auto_answering(RULES, tmp_path / "rules.toml", redis_server.url, namespace) as worker:
        yield worker


async def _run_example(name: str, url: str, namespace: str, module: str) -> str:
    pytest.importorskip(module, reason=f"the extra for {name} is not installed")
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLES / name),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env_for(url, namespace, EXAMPLE_MODEL=""),
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode == 0, err.decode()
    return out.decode().strip()


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("name", "module", "expected"),
    [
        pytest.param("langgraph_plan_review.py", "langgraph", "approved", id="langgraph"),
        pytest.param("pydantic_ai_approval.py", "pydantic_ai", '{"delete_directory":"deleted a"}', id="pydantic-ai"),
        pytest.param("openai_agents_approval.py", "agents", "migration 0042_region applied", id="openai-agents"),
    ],
)
async def test_example_runs_offline(auto, redis_server, namespace, name, module, expected):
    assert await _run_example(name, redis_server.url, namespace, module) == expected
    await auto.expect(r"answered \S+ \(rule at line \d+\)|answered \S+ \(the default rule\)")


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_claude_code_example_payload_is_allowed(auto, redis_server, namespace):
    payload = (EXAMPLES / "claude_code" / "permission_request.json").read_bytes()
    status, out, err = await run_qbroker("claude-hook", url=redis_server.url, namespace=namespace, stdin=payload)
    assert status == 0, err
    assert json.loads(out)["hookSpecificOutput"]["decision"]["behavior"] == "allow"


def test_claude_code_settings_name_a_valid_command():
    settings = json.loads((EXAMPLES / "claude_code" / "settings.json").read_text())
    entries = [entry for event in ("PermissionRequest", "PreToolUse") for entry in settings["hooks"][event]]
    for entry in entries:
        (hook,) = entry["hooks"]
        argv = shlex.split(hook["command"])
        assert argv[:2] == ["qbroker", "claude-hook"]
        args = build_parser().parse_args(argv[1:])
        assert args.timeout < hook["timeout"]  # answer (or fall back) before Claude Code kills the hook
