"""``qbroker ask --gateway`` when the gateway is away: it retries within the ask's own bound, then says why.

A gateway restarts (an upgrade, a crash under a supervisor): an agent that was asking, or starts asking
then, should not fail at once with a library's exception repr. It keeps trying within its own bound (its
timeout, or the client's reconnect window) and ends with a coded error in words; a keyed ask re-attaches
through the restarted gateway to its question in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import Broker, PendingRequest
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


@dataclass
class SocketGateway:
    """Gateways serving one Unix socket (only it, no HTTP) for the shared test Redis, and an agent's token."""

    redis_server: RedisServer
    namespace: str
    tokens_file: Path
    socket: Path
    token: str

    async def start(self) -> Worker:
        gateway, _ = await start_gateway(
            self.redis_server, self.namespace, self.tokens_file, "--socket", str(self.socket), "--no-http"
        )
        return gateway

    async def ask(self, *flags: str) -> asyncio.subprocess.Process:
        """``qbroker ask`` of the question (with ``flags``) through the socket, waiting up to 30 s."""
        return await start_agent(*ASK, *flags, "--timeout", "30", gateway=f"unix:{self.socket}", token=self.token)

    async def killed_and_started_again(self, gateway: Worker) -> Worker:
        """Kill ``gateway`` outright (its in-memory asks die with it) and start another on the same socket."""
        gateway.process.kill()
        await gateway.stop()
        await asyncio.to_thread(self.socket.unlink, missing_ok=True)
        return await self.start()

    @contextlib.asynccontextmanager
    async def shown_then_restarted(
        self, broker: Broker, *flags: str
    ) -> AsyncIterator[tuple[asyncio.subprocess.Process, PendingRequest, asyncio.Queue[PendingRequest]]]:
        """An agent asks (with ``flags``) through a gateway, ``broker``'s provider is shown it (and leaves it
        pending), then the gateway is killed and started again: the agent's process, the card and the provider's
        queue of cards; on exit the second gateway stops cleanly."""
        first = await self.start()
        async with answering(broker, None) as seen:
            asking = await self.ask(*flags)
            pending = await asyncio.wait_for(seen.get(), 15)
            second = await self.killed_and_started_again(first)
            try:
                yield asking, pending, seen
            finally:
                assert await second.stop() == 0


@pytest.fixture
def gateway(redis_server: RedisServer, namespace: str, tmp_path: Path, tokens_file: Path) -> SocketGateway:
    return SocketGateway(redis_server, namespace, tokens_file, tmp_path / "gw.sock", new_token(tokens_file, "ci-bot"))


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
    gateway: SocketGateway, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    broker = await make_broker()
    async with answering(broker) as seen:
        asking = await gateway.ask()
        await asyncio.sleep(1.0)  # it is trying by now
        assert asking.returncode is None
        started = await gateway.start()
        try:
            status, out, err = await finished(asking)
        finally:
            assert await started.stop() == 0
    assert status == 0, err
    assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["yes"]}]}
    assert seen.qsize() == 1  # asked once


async def test_a_keyed_ask_waiting_through_a_killed_gateway_is_answered_by_its_restart(
    gateway: SocketGateway, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    # the gateway dies; the keyed question stays pending in Redis
    restarted = gateway.shown_then_restarted(await make_broker(), "--key", "deploy-7")
    async with restarted as (asking, pending, seen):
        await asyncio.sleep(1.0)  # the agent re-attaches through the new gateway
        await pending.answer(pick("yes"), by="tester")
        status, out, err = await finished(asking)
    assert status == 0, err
    assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["yes"]}]}
    assert seen.empty()  # the same question, not a second card


async def test_an_unkeyed_ask_whose_gateway_restarted_ends_coded_and_says_to_ask_again(
    gateway: SocketGateway, make_broker: Callable[..., Awaitable[Broker]]
) -> None:
    # its unkeyed asks die with it (withdrawn once its liveness lapses)
    async with gateway.shown_then_restarted(await make_broker()) as (asking, _, _):
        status, out, err = await finished(asking)
    error = json.loads(err)
    assert (status, out, error["code"]) == (3, b"", "BROKER_UNAVAILABLE")
    assert "ask again" in error["message"], error
