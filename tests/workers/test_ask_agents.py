"""Several ``qbroker ask --agent ID`` processes at once: one agent asking from several shell steps.

Each ask runs as its own real process under one agent id while a provider shows the questions and
housekeeping (what ``qbroker worker`` runs) judges their askers: none supersedes another, and only
``--restart`` (a new instance of the agent) supersedes the earlier ones, as the seeds require.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.operating.housekeeping import run_housekeeping
from tests.helpers import pick
from tests.workers.procs import env_for
from workers.exits import EXIT_STATUS


async def _shown(provider: Any) -> Any:
    return await asyncio.wait_for(anext(aiter(provider)), 20)


async def _deploy_then_migrate(ask: Any, provider: Any, *flags: str) -> tuple[Any, Any, Any, Any]:
    """'Deploy?' asked by one process and shown, then 'Migrate?' (with ``flags``) by another and shown: the
    two processes' tasks and the two cards, in that order."""
    deploying = ask("Deploy?")
    deploy = await _shown(provider)
    migrating = ask("Migrate?", *flags)
    return deploying, deploy, migrating, await _shown(provider)


@contextlib.asynccontextmanager
async def asking(redis_server: Any, namespace: str) -> AsyncIterator[Any]:
    """Start ``qbroker ask --agent deployer`` processes; each is a task of (status, stdout, stderr)."""
    processes: list[asyncio.subprocess.Process] = []

    async def run(*args: str) -> tuple[int, bytes, bytes]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "workers",
            "ask",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env_for(redis_server.url, namespace),
        )
        processes.append(process)
        out, err = await process.communicate()
        assert process.returncode is not None
        return process.returncode, out, err

    def ask(text: str, *extra: str) -> asyncio.Task[tuple[int, bytes, bytes]]:
        return asyncio.create_task(run("-q", text, "-o", "yes", "-o", "no", "--agent", "deployer", *extra))

    try:
        yield ask
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
            await process.wait()


@pytest.mark.timeout(50)
async def test_two_asks_under_one_agent_id_at_once_are_both_answered(make_broker, redis_server, namespace):
    """Issue 26 item 2: the older process's question was withdrawn as 'no longer the live instance' (exit 11)."""
    broker = await make_broker()
    async with broker.provider("ui") as provider, asking(redis_server, namespace) as ask:
        first, deploy, second, migrate = await _deploy_then_migrate(ask, provider)
        report = await run_housekeeping(broker)  # what `qbroker worker` does every run
        assert report.withdrawn == []
        assert not deploy.withdrawn.is_set() and not migrate.withdrawn.is_set()
        await deploy.answer(pick("yes"))
        await migrate.answer(pick("no"))
        (status1, out1, err1), (status2, out2, err2) = await asyncio.wait_for(asyncio.gather(first, second), 20)
    assert (status1, status2) == (0, 0), (err1, err2)
    assert json.loads(out1)["answers"][0]["selected"] == ["yes"]
    assert json.loads(out2)["answers"][0]["selected"] == ["no"]


@pytest.mark.timeout(50)
async def test_a_restarted_agent_supersedes_its_earlier_processes(make_broker, redis_server, namespace):
    broker = await make_broker()
    async with broker.provider("ui") as provider, asking(redis_server, namespace) as ask:
        old, deploy, new, migrate = await _deploy_then_migrate(ask, provider, "--restart")
        report = await run_housekeeping(broker)
        assert report.withdrawn == [deploy.request_id]
        status, _, err = await asyncio.wait_for(old, 20)
        assert status == EXIT_STATUS["CALLER_NOT_LIVE"], err
        await asyncio.wait_for(deploy.withdrawn.wait(), 10)  # the UI is told to take it down
        await migrate.answer(pick("yes"))
        status, out, err = await asyncio.wait_for(new, 20)
    assert status == 0, err
    assert json.loads(out)["answers"][0]["selected"] == ["yes"]


AGENT_TTL_S = 15  # the broker's default agent TTL: a process beats every third of it


def _lines_about(err: bytes, agent: str) -> list[str]:
    return [line for line in err.decode().splitlines() if f"agent {agent} " in line]


@pytest.mark.timeout(50)
@pytest.mark.parametrize("learns", ["from-its-withdrawn-ask", "from-its-heartbeat"])
async def test_a_superseded_process_says_whole_what_happened_and_what_to_do(
    make_broker, redis_server, namespace, learns
):
    """Issue "The page a team trusts at fleet size", row 7: the superseded process's line was cut off ("no
    longer one of its live instance's") and, when its question was withdrawn before its next heartbeat (15 s
    TTL: every 5 s), never printed at all. It says, once, that a restart superseded it and how to ask again."""
    broker = await make_broker()
    async with broker.provider("ui") as provider, asking(redis_server, namespace) as ask:
        old, deploy, new, migrate = await _deploy_then_migrate(ask, provider, "--restart")
        if learns == "from-its-heartbeat":
            await asyncio.sleep(AGENT_TTL_S / 3 + 1)  # its next heartbeat finds it superseded (not a timed assertion)
        await run_housekeeping(broker)  # else withdrawn at once: it learns only as it leaves
        status, _, err = await asyncio.wait_for(old, 20)
        assert status == EXIT_STATUS["CALLER_NOT_LIVE"], err
        await asyncio.wait_for(deploy.withdrawn.wait(), 10)
        await migrate.answer(pick("yes"))
        assert (await asyncio.wait_for(new, 20))[0] == 0
    (line,) = _lines_about(err, "deployer")
    assert "restarted" in line and "superseded" in line, line
    assert "questions are withdrawn" in line and "cannot ask again" in line, line
    assert line.rstrip().endswith("`qbroker ask --agent deployer` without --restart joins the new instance"), line
