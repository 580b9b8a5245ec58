"""The demo works on both embedded back ends: a private redis-server and fakeredis in-process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from broker import Broker
from tests.helpers import KEYS, one_question, pick
from workers.embedded import embedded_redis

ROOT = Path(__file__).resolve().parent.parent


def run_demo(path: str) -> str:
    env = {**os.environ, "PATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "workers.demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_demo_prints_both_answers_on_a_private_redis_server() -> None:
    out = run_demo(os.environ["PATH"])
    assert "private redis-server" in out
    assert 'agent got: {"answers":[{"id":"plan","selected":["Approve"]}]}' in out
    assert '"id":"envs","selected":["staging"],"custom":"and nothing else"' in out


def test_the_demo_falls_back_to_fakeredis_without_redis_server(tmp_path: Path) -> None:
    out = run_demo(str(tmp_path))  # a PATH with no redis-server on it
    assert "fakeredis" in out
    assert '"id":"note","selected":[]' in out


async def test_the_broker_round_trip_on_fakeredis(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with embedded_redis() as redis:
        assert redis.connect is not None
        asking, answering = (
            Broker(redis.url, "fast", connect=redis.connect, **KEYS),
            Broker(redis.url, "fast", connect=redis.connect, **KEYS),
        )
        async with asking, answering, answering.provider("ui") as provider:
            task = asyncio.create_task(asking.ask(one_question(), timeout=5))
            pending = await asyncio.wait_for(anext(aiter(provider)), 5)
            await pending.answer(pick("yes"))
            assert await task == pick("yes")


def test_the_make_demo_target_runs_the_demo_module() -> None:
    """README's first set-up command is `make demo`: its recipe must name the real module."""
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "-m workers.demo" in recipe
