"""``qbroker mcp`` called by the official MCP TypeScript SDK's client (``tests/mcp_ts``).

That client validates a result's ``structuredContent`` against the tool's ``outputSchema`` whenever it
is present, errors included, and throws a protocol error (-32602) for one that does not fit: a coded
failure that did not fit the schema reached a TypeScript agent as a protocol error instead of its code.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import SIGNING_KEY
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent
CLIENT = ROOT / "tests" / "mcp_ts"
SDK = CLIENT / "node_modules" / "@modelcontextprotocol" / "sdk"


async def call_with_the_typescript_client(
    redis_server: RedisServer, namespace: str, calls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    server = [sys.executable, "-m", "workers.asking.mcp.command", "--redis-url", redis_server.url, "-n", namespace]
    env = {**os.environ, "QBROKER_TRUSTED_KEYS": SIGNING_KEY.public_text}
    process = await asyncio.create_subprocess_exec(
        "node",
        str(CLIENT / "client.mjs"),
        *server,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    async with asyncio.timeout(30):
        out, _ = await process.communicate(json.dumps(calls).encode())
    assert process.returncode == 0
    return [json.loads(line) for line in out.decode().splitlines()]


@pytest.mark.skipif(
    shutil.which("node") is None or not SDK.exists(), reason="the TypeScript SDK is missing: `npm ci` in tests/mcp_ts"
)
async def test_a_coded_failure_reaches_the_typescript_client_as_its_code(
    redis_server: RedisServer, namespace: str
) -> None:
    no_questions: dict[str, Any] = {"questions": []}
    nobody_answers = {"questions": [{"id": "go", "question": "Deploy now?", "options": ["yes", "no"]}]}
    empty, no_provider = await call_with_the_typescript_client(redis_server, namespace, [no_questions, nobody_answers])
    for result, code in ((empty, "EMPTY_QUESTIONS"), (no_provider, "NO_PROVIDER")):
        assert "protocolError" not in result, result
        assert result["isError"] is True
        assert result["structuredContent"]["code"] == code
