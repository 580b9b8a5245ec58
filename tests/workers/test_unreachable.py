"""A command pointed at a Redis that is not there says so in one line, then ends with a coded error."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from broker import Broker
from tests.helpers import KEYS
from tests.redis_server import free_port
from tests.workers.procs import run_qbroker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(40)]


@pytest.mark.parametrize(
    "command",
    [("status",), ("decisions", "list"), ("ask", "-q", "Deploy now?", "-o", "yes", "-o", "no")],
    ids=["status", "decisions", "ask"],
)
async def test_an_unreachable_redis_is_one_warning_then_broker_unavailable(command: tuple[str, ...]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    started = time.monotonic()
    status, out, err = await run_qbroker(*command, url=url, namespace="nowhere", limit=20)
    took = time.monotonic() - started
    lines = err.decode().splitlines()
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) == 1, "\n".join(lines)
    assert status == 3, (out, err)
    error = json.loads((out or err).decode().strip().splitlines()[-1])
    assert error["code"] == "BROKER_UNAVAILABLE"
    assert took < 8, took


@pytest.mark.timeout(30)
async def test_the_one_warning_is_per_outage_and_recovery_is_said(redis_factory, caplog) -> None:
    """A process that rides an outage out logs its start once and its end once, not every retry;
    the next outage is told again."""
    caplog.set_level(logging.WARNING, logger="broker._commands")
    server = redis_factory()
    async with Broker(server.url, "outage", unavailable_after=30, **KEYS) as broker:
        for outage in (1, 2):
            await broker.commands.call("PING")
            server.kill()
            call = asyncio.create_task(broker.commands.call("PING"))
            await asyncio.sleep(2.5)  # several retries while it is down
            server.start()
            await asyncio.wait_for(call, 10)
            told = [r.getMessage() for r in caplog.records if r.name == "broker._commands"]
            assert sum("interrupted" in m for m in told) == outage, told
            assert sum("answers again" in m for m in told) == outage, told
