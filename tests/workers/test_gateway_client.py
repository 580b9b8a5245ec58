"""``qbroker ask --gateway`` when the gateway is away: it retries within the ask's own bound, then says why.

A gateway restarts (an upgrade, a crash under a supervisor): an agent that was asking, or starts asking
then, should not fail at once with a library's exception repr. It keeps trying within its own bound (its
timeout, or the client's reconnect window) and ends with a coded error in words; a keyed ask re-attaches
through the restarted gateway to its question in Redis.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker import Broker
from tests.helpers import pick
from tests.redis_server import RedisServer
from tests.workers.procs import Worker, finished
from tests.workers.test_gateway import answering, start_agent, start_gateway
from workers.asking.gateway.tokens import new_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(45)]

ASK = ("ask", "-q", "Deploy now?", "-o", "yes", "-o", "no")


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    return tmp_path / "tokens"


async def gateway_on(redis_server: RedisServer, namespace: str, tokens_file: Path, socket: Path) -> tuple[Worker, str]:
    return await start_gateway(redis_server, namespace, tokens_file, "--socket", str(socket), "--no-http")


async def killed_and_started_again(
    gateway: Worker, redis_server: RedisServer, namespace: str, tokens_file: Path, socket: Path
) -> Worker:
    """Kill ``gateway`` outright (its in-memory asks die with it) and start another on the same socket."""
    gateway.process.kill()
    await gateway.stop()
    await asyncio.to_thread(socket.unlink, missing_ok=True)
    again, _ = await gateway_on(redis_server, namespace, tokens_file, socket)
    return again


async def test_an_ask_at_a_gateway_that_is_not_there_ends_coded_and_in_words(tmp_path: Path, tokens_file: Path) -> None:
    socket = tmp_path / "gw.sock"
    asking = await start_agent(
        *ASK, "--timeout", "1.5", gateway=f"unix:{socket}", token=new_token(tokens_file, "ci-bot")
    )
    status, out, err = await finished(asking)
    error = json.loads(err)
    assert (status, out, error["code"]) == (3, b"", "BROKER_UNAVAILABLE")
    assert str(socket) in error["message"] and "No such file or directory" in error["message"], error
    assert "Error(" not in error["message"] and "Connector" not in error["message"], error  # words, not a repr


async def test_an_ask_started_while_the_gateway_is_down_is_answered_once_it_is_up(
    redis_server: RedisServer,
    namespace: str,
    tmp_path: Path,
    tokens_file: Path,
    make_broker: Callable[..., Awaitable[Broker]],
) -> None:
    socket, token = tmp_path / "gw.sock", new_token(tokens_file, "ci-bot")
    broker = await make_broker()
    async with answering(broker) as seen:
        asking = await start_agent(*ASK, "--timeout", "30", gateway=f"unix:{socket}", token=token)
        await asyncio.sleep(1.0)  # it is trying by now
        assert asking.returncode is None
        gateway, _ = await gateway_on(redis_server, namespace, tokens_file, socket)
        try:
            status, out, err = await finished(asking)
        finally:
            assert await gateway.stop() == 0
    assert status == 0, err
    assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["yes"]}]}
    assert seen.qsize() == 1  # asked once


async def test_a_keyed_ask_waiting_through_a_killed_gateway_is_answered_by_its_restart(
    redis_server: RedisServer,
    namespace: str,
    tmp_path: Path,
    tokens_file: Path,
    make_broker: Callable[..., Awaitable[Broker]],
) -> None:
    socket, token, path = tmp_path / "gw.sock", new_token(tokens_file, "ci-bot"), tokens_file
    broker = await make_broker()
    first, _ = await gateway_on(redis_server, namespace, path, socket)
    async with answering(broker, None) as seen:
        asking = await start_agent(*ASK, "--key", "deploy-7", "--timeout", "30", gateway=f"unix:{socket}", token=token)
        pending = await asyncio.wait_for(seen.get(), 15)
        # the gateway dies; the keyed question stays pending in Redis
        second = await killed_and_started_again(first, redis_server, namespace, path, socket)
        try:
            await asyncio.sleep(1.0)  # the agent re-attaches through the new gateway
            await pending.answer(pick("yes"), by="tester")
            status, out, err = await finished(asking)
        finally:
            assert await second.stop() == 0
    assert status == 0, err
    assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["yes"]}]}
    assert seen.empty()  # the same question, not a second card


async def test_an_unkeyed_ask_whose_gateway_restarted_ends_coded_and_says_to_ask_again(
    redis_server: RedisServer,
    namespace: str,
    tmp_path: Path,
    tokens_file: Path,
    make_broker: Callable[..., Awaitable[Broker]],
) -> None:
    socket, token, path = tmp_path / "gw.sock", new_token(tokens_file, "ci-bot"), tokens_file
    broker = await make_broker()
    first, _ = await gateway_on(redis_server, namespace, path, socket)
    async with answering(broker, None) as seen:
        asking = await start_agent(*ASK, "--timeout", "30", gateway=f"unix:{socket}", token=token)
        await asyncio.wait_for(seen.get(), 15)
        # its unkeyed asks die with it (withdrawn once its liveness lapses)
        second = await killed_and_started_again(first, redis_server, namespace, path, socket)
        try:
            status, out, err = await finished(asking)
        finally:
            assert await second.stop() == 0
    error = json.loads(err)
    assert (status, out, error["code"]) == (3, b"", "BROKER_UNAVAILABLE")
    assert "ask again" in error["message"], error
