"""``qbroker quickstart`` as a new team runs it: real processes, a real redis-server, sign-in over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest

from tests.redis_server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")}


async def _read_banner(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(40):
        while not any("Ctrl-C" in line for line in lines):
            raw = await process.stdout.readline()
            if not raw:
                raise AssertionError("quickstart ended early:\n" + "".join(lines))
            lines.append(raw.decode())
    return "".join(lines)


def _port_open(url: str) -> bool:
    host, port = re.match(r"redis://([\d.]+):(\d+)", url).groups()  # type: ignore[union-attr]
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


async def test_quickstart_serves_a_page_a_person_signs_into_and_answers_a_shell_ask(tmp_path: Path) -> None:
    port = free_port()
    quickstart = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", "-n", "team", "quickstart", "--port", str(port), "--user", "alice",
        "--dir", str(tmp_path / "qs"),
        cwd=ROOT, env=_clean_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        banner = await _read_banner(quickstart)
        page = re.search(r"Page:\s+(\S+)", banner).group(1)  # type: ignore[union-attr]
        password = re.search(r"Password:\s+(\S+)", banner).group(1)  # type: ignore[union-attr]
        exports = re.search(r"export (.+)", banner).group(1)  # type: ignore[union-attr]
        asker_env = _clean_env() | dict(pair.split("=", 1) for pair in shlex.split(exports))
        assert page == f"http://127.0.0.1:{port}"
        assert "private redis-server" in banner
        assert set(asker_env) >= {"QBROKER_REDIS_URL", "QBROKER_NAMESPACE", "QBROKER_TRUSTED_KEYS_FILE"}
        # An asker gets the public key only: nothing it holds can sign an answer.
        assert "qbsk1:" not in (tmp_path / "qs" / "team.pub").read_text()
        assert asker_env["QBROKER_TRUSTED_KEYS_FILE"] == str(tmp_path / "qs" / "team.pub")

        ask = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers", "ask", "-q", "Deploy now?", "-o", "yes", "-o", "no", "--timeout", "30",
            cwd=ROOT, env=asker_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with httpx.AsyncClient(base_url=page, timeout=5) as client:
            wrong = await client.post("/api/session", json={"user": "alice", "password": password + "x"})
            assert wrong.status_code == 401
            signed = await client.post("/api/session", json={"user": "alice", "password": password})
            assert signed.status_code == 200, signed.text
            client.headers["X-CSRF-Token"] = signed.json()["csrf"]
            async with asyncio.timeout(15):
                while not (requests := (await client.get("/api/requests")).json()["requests"]):
                    await asyncio.sleep(0.1)
            request = requests[0]
            qid = request["questions"][0]["id"]
            answered = await client.post(
                f"/api/requests/{request['id']}/answer", json={"answers": [{"id": qid, "selected": ["yes"]}]}
            )
            assert answered.status_code == 200, answered.text
        out, err = await asyncio.wait_for(ask.communicate(), 20)
        assert ask.returncode == 0, err.decode()
        assert json.loads(out)["answers"][0]["selected"] == ["yes"]
        assert (tmp_path / "qs" / "worker.log").exists()  # the maintenance worker was started too
    finally:
        if quickstart.returncode is None:
            quickstart.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(quickstart.communicate(), 20)
    assert quickstart.returncode == 0, err.decode()
    assert not _port_open(asker_env["QBROKER_REDIS_URL"])  # the private Redis went with it
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{page}/healthz")
