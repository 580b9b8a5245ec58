"""``qbroker quickstart`` as a new team runs it: real processes, a real redis-server, sign-in over HTTP.

Each test attacks or stops the stack the way the field did (issue "every approval is one informed
human decision", row 6): an asker holding only what the banner's ``export`` line gives, a closed
terminal (SIGHUP), a quickstart killed outright, a second quickstart on a port the first still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, RedisError

from tests.redis_server import free_port
from workers.answering.web.keys import WebKeys, digest
from workers.asking.gateway.tokens import Tokens
from workers.exits import EXIT_STATUS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]
NS = "team"


def _env(tmp_path: Path) -> dict[str, str]:
    """No QBROKER_ setting of the developer's, and a TMPDIR of the test's own: what is left there is ours."""
    temporary = tmp_path / "tmp"
    temporary.mkdir(exist_ok=True)
    return {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")} | {"TMPDIR": str(temporary)}


async def _quickstart(tmp_path: Path, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", "-n", NS, "quickstart", "--user", "alice", *args,
        cwd=ROOT, env=_env(tmp_path), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


def _ports(*, redis: bool = False) -> list[str]:
    """Free ports for the page and the gateway (and the private Redis): tests run side by side."""
    ports = ["--port", str(free_port()), "--gateway-port", str(free_port())]
    return [*ports, "--redis-port", str(free_port())] if redis else ports


async def _read_banner(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    lines: list[str] = []
    async with asyncio.timeout(40):
        while not any("Ctrl-C" in line for line in lines):
            raw = await process.stdout.readline()
            if not raw:
                assert process.stderr is not None
                err = (await process.stderr.read()).decode()
                raise AssertionError("quickstart ended early:\n" + "".join(lines) + err)
            lines.append(raw.decode())
    return "".join(lines)


def _field(banner: str, pattern: str) -> str:
    found = re.search(pattern, banner)
    assert found, f"{pattern!r} not in the banner:\n{banner}"
    return found.group(1)


def _exports(banner: str) -> dict[str, str]:
    """What the banner tells an asking shell to export: all an asker is given."""
    return dict(pair.split("=", 1) for pair in shlex.split(_field(banner, r"export (.+)")))


def _redis_address(banner: str) -> str:
    """The private Redis the banner names, without credentials: an attacker on the machine sees it (ps, ss)."""
    return _field(banner, r"(redis://[\d.]+:\d+/\d+)")


def _files(banner: str) -> Path:
    """The directory of the keys, the users file and the logs."""
    return Path(_field(banner, r"Logs: (\S+)/web\.log"))


def _descendants(root: int) -> set[int]:
    """Every process below ``root`` (by parent pid), read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def _none_alive(pids: set[int], within: float = 20) -> set[int]:
    """The processes of ``pids`` still alive after ``within`` seconds (empty once all are gone)."""
    deadline = time.monotonic() + within
    while (left := {pid for pid in pids if _alive(pid)}) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


def _role_of(pid: int) -> tuple[str, str]:
    """A child's command (web, worker, gateway) and the Redis user its environment connects as."""
    argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    command = next((a.decode() for a in argv if a in (b"web", b"worker", b"gateway")), "")
    environ = dict(
        item.split(b"=", 1) for item in (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0") if b"=" in item
    )
    return command, urlsplit(environ.get(b"QBROKER_REDIS_URL", b"").decode()).username or ""


@contextlib.asynccontextmanager
async def _running(tmp_path: Path, *args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """A quickstart and its banner; stopped with Ctrl-C (SIGINT) at the end unless the test stopped it.

    Whatever it started and left running (a failing test, the unfixed code) is killed here.
    """
    quickstart = await _quickstart(tmp_path, *_ports(), *args)
    children: set[int] = set()
    try:
        banner = await _read_banner(quickstart)
        children = _descendants(quickstart.pid)
        yield quickstart, banner
    finally:
        if quickstart.returncode is None:
            quickstart.send_signal(signal.SIGINT)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(quickstart.communicate(), 20)
        for pid in await _none_alive(children, within=2):
            os.kill(pid, signal.SIGKILL)


async def _page_answers(page: str, password: str, label: str) -> dict[str, Any]:
    """alice signs in and answers the first request with ``label``; returns the request as the page showed it."""
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
        answers = [{"id": request["questions"][0]["id"], "selected": [label]}]
        answered = await client.post(f"/api/requests/{request['id']}/answer", json={"answers": answers})
        assert answered.status_code == 200, answered.text
        return request


async def test_an_ask_through_the_exported_gateway_settings_is_answered_on_the_page(tmp_path: Path) -> None:
    async with _running(tmp_path, "--dir", str(tmp_path / "qs")) as (quickstart, banner):
        page = _field(banner, r"Page:\s+(\S+)")
        password = _field(banner, r"Password:\s+(\S+)")
        asker_env = _exports(banner)
        assert "private redis-server" in banner
        # The asking shell gets the gateway and its token: no Redis URL, no key, not even the public one.
        assert set(asker_env) == {"QBROKER_GATEWAY_URL", "QBROKER_GATEWAY_TOKEN"}
        assert asker_env["QBROKER_GATEWAY_TOKEN"].startswith("qbgt1_")
        assert "qbsk1:" not in (tmp_path / "qs" / f"{NS}.pub").read_text()

        ask = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "workers", "ask", "-q", "Deploy now?", "-o", "yes", "-o", "no", "--timeout", "30",
            cwd=ROOT, env=_env(tmp_path) | asker_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        # an operator's `qbroker status` with the documented maintenance.env says what the page says: verified
        operator = dict(
            line.split("=", 1) for line in (tmp_path / "qs" / "maintenance.env").read_text().splitlines() if line
        )
        async with asyncio.timeout(15):
            while True:
                status = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "workers", "status", "--json",
                    cwd=ROOT, env=_env(tmp_path) | operator, stdout=asyncio.subprocess.PIPE,
                )  # fmt: skip
                listed = json.loads((await status.communicate())[0])["pending"]
                if listed:
                    break
                await asyncio.sleep(0.2)
        assert [p["verified"] for p in listed] == [True], listed
        shown = await _page_answers(page, password, "yes")
        # the token decided the agent, and the page pins the gateway's key: the id shows as verified
        assert shown["verified"] and [a["agent"] for a in shown["askers"]] == ["agent"]
        out, err = await asyncio.wait_for(ask.communicate(), 20)
        assert ask.returncode == 0, err.decode()
        assert json.loads(out)["answers"][0]["selected"] == ["yes"]
        assert (tmp_path / "qs" / "worker.log").exists()  # the maintenance worker was started too
        redis_url, gateway = _redis_address(banner), asker_env["QBROKER_GATEWAY_URL"]
        quickstart.send_signal(signal.SIGINT)
        await asyncio.wait_for(quickstart.communicate(), 20)
        assert quickstart.returncode == 0
    async with httpx.AsyncClient(timeout=2) as client:
        for address in (redis_url.replace("redis://", "http://"), page, gateway):
            with pytest.raises(httpx.ConnectError):  # the private Redis, the page and the gateway went with it
                await client.get(address)


async def test_what_the_export_line_gives_cannot_forge_a_web_session(tmp_path: Path) -> None:
    """Row 6's attack: an asker writes a session record for alice, then answers on the page with its cookie."""
    async with _running(tmp_path) as (_, banner):
        page, exported = _field(banner, r"Page:\s+(\S+)"), _exports(banner)
        cookie = "forged-cookie-" + "x" * 32
        record = json.dumps({"user": "alice", "csrf": "forged-csrf", "created_ms": int(time.time() * 1000)})
        # with the Redis URL the line gives, if any; else with none at all, at the address the banner names
        attacker = Redis.from_url(exported.get("QBROKER_REDIS_URL") or _redis_address(banner))
        try:
            with pytest.raises(RedisError):
                await attacker.set(WebKeys(NS).session(digest(cookie)), record, px=600_000)
        finally:
            await attacker.aclose()
        async with httpx.AsyncClient(base_url=page, timeout=5, cookies={"qb_session": cookie}) as client:
            assert (await client.get("/api/requests")).status_code == 401


async def test_the_private_redis_refuses_a_connection_without_credentials(tmp_path: Path) -> None:
    async with _running(tmp_path) as (_, banner):
        anonymous = Redis.from_url(_redis_address(banner))
        try:
            with pytest.raises(AuthenticationError):
                await anonymous.ping()
        finally:
            await anonymous.aclose()


async def test_each_child_connects_to_redis_as_its_own_role(tmp_path: Path) -> None:
    async with _running(tmp_path) as (quickstart, _):
        roles = dict(_role_of(pid) for pid in _descendants(quickstart.pid))
        roles.pop("", None)  # redis-server, and the guard that stops the rest if quickstart is killed
        assert roles == {"web": f"{NS}-answerer", "worker": f"{NS}-maintenance", "gateway": f"{NS}-asker"}


async def test_the_keys_live_in_a_private_directory(tmp_path: Path) -> None:
    async with _running(tmp_path) as (_, banner):
        files = _files(banner)
        assert files.is_relative_to(tmp_path / "tmp") and (files / f"{NS}.key").exists()
        assert files.stat().st_mode & 0o777 == 0o700
        modes = {str(f.relative_to(files)): f.stat().st_mode & 0o777 for f in files.rglob("*")}
        assert {"redis/users.acl", "gateway/attest.key", "users.toml", "gateway.tokens", "asker.env"} <= set(modes)
        assert modes == {name: 0o700 if (files / name).is_dir() else 0o600 for name in modes}


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_stop_signal_leaves_no_process_and_no_key_file(tmp_path: Path, signum: signal.Signals) -> None:
    async with _running(tmp_path) as (quickstart, banner):
        children = _descendants(quickstart.pid)
        assert (_files(banner) / f"{NS}.key").exists()
        assert len(children) >= 4  # redis-server, web, worker, gateway
        quickstart.send_signal(signum)  # SIGHUP: the terminal closed
        await asyncio.wait_for(quickstart.communicate(), 20)
        assert quickstart.returncode == 0
        assert await _none_alive(children, within=5) == set()
        assert list((tmp_path / "tmp").iterdir()) == []  # the keys, the users file, the token: all gone


async def test_a_quickstart_killed_outright_leaves_no_process_and_no_key_file(tmp_path: Path) -> None:
    async with _running(tmp_path) as (quickstart, banner):
        children = _descendants(quickstart.pid)
        assert (_files(banner) / f"{NS}.key").exists()
        quickstart.kill()
        await asyncio.wait_for(quickstart.communicate(), 20)
        assert await _none_alive(children, within=20) == set()
        assert list((tmp_path / "tmp").iterdir()) == []


def _of_this_test(tmp_path: Path) -> set[int]:
    """The processes whose environment carries this test's TMPDIR: what its quickstart started, wherever they went."""
    marker = b"\0TMPDIR=" + str(tmp_path / "tmp").encode() + b"\0"
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in b"\0" + (entry / "environ").read_bytes() and _alive(int(entry.name)):
                    found.add(int(entry.name))
    return found


async def test_a_signal_during_the_start_stops_what_started_and_nothing_is_said_to_run(tmp_path: Path) -> None:
    quickstart = await _quickstart(tmp_path, *_ports(), "--dir", str(tmp_path / "qs"))
    try:
        async with asyncio.timeout(20):
            while not (tmp_path / "qs" / "web.log").exists():  # the page is starting, not yet answering
                await asyncio.sleep(0.02)
        quickstart.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(quickstart.communicate(), 30)
        assert quickstart.returncode == 0
        assert "running" not in out.decode() and "Password" not in out.decode()
        assert await _none_alive(_of_this_test(tmp_path) - {os.getpid()}, within=5) == set()
    finally:
        for pid in _of_this_test(tmp_path) - {os.getpid()}:
            os.kill(pid, signal.SIGKILL)


def test_a_kept_directorys_earlier_token_stops_working_at_the_next_start(tmp_path: Path) -> None:
    """Like the password, the token is new at each start: one printed in an earlier session asks no more."""
    from workers.operating.quickstart.stack import _agent_token

    _, earlier = _agent_token(tmp_path, "agent")
    tokens_file, token = _agent_token(tmp_path, "agent")
    tokens = Tokens(tokens_file)
    assert tokens.agent_for(token) == "agent"
    assert tokens.agent_for(earlier) is None


async def _orphan_page(port: int) -> asyncio.Server:
    """What a killed quickstart left on a port: something that answers every request 200, /healthz too."""

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            body = b'{"status":"active","holder":"web@orphan","redis":"ok"}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n")
            writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        writer.close()

    return await asyncio.start_server(reply, "127.0.0.1", port)


@pytest.mark.parametrize("taken", ["--port", "--gateway-port", "--redis-port"])
async def test_a_taken_port_is_a_coded_error_and_nothing_is_said_to_run(tmp_path: Path, taken: str) -> None:
    args = _ports(redis=True)
    port = int(args[args.index(taken) + 1])
    async with await _orphan_page(port):
        quickstart = await _quickstart(tmp_path, *args)
        out, err = await asyncio.wait_for(quickstart.communicate(), 30)
    assert quickstart.returncode == EXIT_STATUS["PORT_IN_USE"], (out + err).decode()
    assert f"PORT_IN_USE: port {port}" in err.decode()
    assert "running" not in out.decode() and "Password" not in out.decode()
    assert list((tmp_path / "tmp").iterdir()) == []
