"""``qbroker audit verify``, as a real process: exit statuses and output."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broker.signing import SigningKey
from tests.redis_server import RedisServer
from tests.test_audit import real_run
from tests.workers.procs import env_for, run_qbroker

pytestmark = pytest.mark.timeout(60)


async def verify_with(url: str, namespace: str, *args: str, **env: str) -> tuple[int, str, str]:
    """``qbroker audit verify`` with the keys given here only (not the tests' signing key)."""
    environ = env_for(url, namespace)
    environ.update({"QBROKER_SIGNING_KEY": "", "QBROKER_TRUSTED_KEYS": "", **env})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", "audit", "verify", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=environ,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_real_run_verifies_and_a_deleted_entry_fails_it(
    make_broker: Callable[..., Any], redis: Redis, redis_server: RedisServer, namespace: str
) -> None:
    broker = await real_run(make_broker, redis)
    status, out, err = await run_qbroker("audit", "verify", "--json", url=redis_server.url, namespace=namespace)
    assert status == 0, err
    report = json.loads(out)
    assert report["status"] == "intact" and report["findings"] == [] and report["checkpoints"] == 1
    status, out, _ = await run_qbroker("audit", "verify", url=redis_server.url, namespace=namespace)
    assert status == 0 and "INTACT" in out.decode() and "(the beginning of the chain)" in out.decode()

    victim = next(i for i, f in await redis.xrange(broker.keys.audit) if f["event"] == "expired")
    await redis.xdel(broker.keys.audit, victim)
    status, out, _ = await run_qbroker("audit", "verify", url=redis_server.url, namespace=namespace)
    assert status == 20
    text = out.decode()
    assert "TAMPERED" in text and f"deleted    {victim}" in text


async def test_checkpoints_by_a_key_not_trusted_fail_it(
    make_broker: Callable[..., Any], redis: Redis, redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    await real_run(make_broker, redis)
    trusted = tmp_path / "trusted.pub"
    trusted.write_text(SigningKey.generate().public_text + "\n")
    status, out, _ = await verify_with(redis_server.url, namespace, "--json", "--trusted-keys-file", str(trusted))
    assert status == 20
    assert [f["kind"] for f in json.loads(out)["findings"]] == ["checkpoint"]
    status, _, _ = await verify_with(
        redis_server.url, namespace, QBROKER_TRUSTED_KEYS=SigningKey.generate().public_text
    )
    assert status == 20


async def test_without_a_trusted_key_it_refuses(redis_server: RedisServer, namespace: str) -> None:
    status, _, err = await verify_with(redis_server.url, namespace)
    assert status == 17 and "NO_TRUSTED_KEY" in err


async def test_an_audit_never_chained_says_so(redis: Redis, redis_server: RedisServer, namespace: str) -> None:
    from broker._keys import Keys

    await redis.xadd(Keys(namespace).audit, {"event": "answered", "rid": "r1"})  # as an older version wrote it
    status, out, _ = await run_qbroker("audit", "verify", url=redis_server.url, namespace=namespace)
    assert status == 21 and "UNCHAINED" in out.decode()
