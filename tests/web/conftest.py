from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, Broker
from tests.helpers import KEYS
from tests.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
SSL_CONTEXT = httpx.create_ssl_context()
"""one for every test client (``verify=SSL_CONTEXT``): httpx loads certifi's CA bundle into a fresh context,
30 ms of CPU, for each client made without one"""
PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}
TOKEN = "ci-bot-token-0123456789abcdef"


def _quick_hash(password: str) -> str:
    """A users-file scrypt hash at cost 2**10, not the default 2**14: the page checks a password at the cost its
    hash names, and at the default each sign-in took 60 ms of a web process's CPU (a quarter of it in test_api
    and test_security). What the default costs, for a known and an unknown name alike, is test_security's."""
    salt = os.urandom(16)
    key = hashlib.scrypt(password.encode(), salt=salt, n=2**10, r=8, p=1)
    return f"scrypt${2**10}$8$1${salt.hex()}${key.hex()}"


_HASHES = {user: _quick_hash(password) for user, password in PASSWORDS.items()}


def write_users_file(path: Path) -> Path:
    users = [f'{user} = "{hashed}"' for user, hashed in _HASHES.items()]
    lines = ["[users]", *users, "[tokens]", f'ci-bot = "{TOKEN}"']
    path.write_text("\n".join(lines) + "\n")
    return path


def qbroker(redis_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``qbroker -n NS --redis-url URL web sessions ARGS...`` as a real process."""
    command = [sys.executable, "-m", "workers.cli", "-n", namespace, "--redis-url", redis_url, "web", "sessions"]
    return subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)


@dataclass
class WebProcess:
    """``python -m workers.answering.web`` on a free port, as a real process."""

    redis_url: str
    namespace: str
    users_file: Path
    log_path: Path
    name: str = "web-1"
    extra: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> WebProcess:
        args = [
            sys.executable, "-m", "workers.answering.web",
            "--port", str(self.port), "--redis-url", self.redis_url, "--namespace", self.namespace,
            "--name", self.name, "--users-file", str(self.users_file), "--lease-ttl", "2", *self.extra,
        ]  # fmt: skip
        env = {**os.environ, "QBROKER_LOG_LEVEL": "INFO"}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        # One client for the whole wait, on the one SSL context: a new httpx client loads certifi's CA bundle
        # into a fresh one (30 ms of CPU), and a poll every 50 ms made that most of a web test's own CPU.
        with httpx.Client(base_url=self.url, timeout=0.5, verify=SSL_CONTEXT) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"web process exited: {self.log_path.read_text()}")
                try:
                    if client.get("/healthz").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise RuntimeError(f"web process did not start: {self.log_path.read_text()}")

    def status(self) -> str:
        return str(httpx.get(self.url + "/healthz", timeout=2).json()["status"])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def module_web(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, namespace: str, *extra: str
) -> Iterator[WebProcess]:
    """The body of a module-scoped ``web`` fixture: one web process (alice, bob and the ci-bot token) that a
    module's tests share, stopped after the last of them."""
    tmp = tmp_path_factory.mktemp("web")
    users_file = write_users_file(tmp / "users.toml")
    process = WebProcess(redis_server.url, namespace, users_file, tmp / "web.log", extra=list(extra))
    yield process.start()
    process.stop()


Backlog = tuple[Broker, list[asyncio.Task[AskUserQuestionAnswer]]]
"""the asker of a backlog, and its asks"""


@contextlib.asynccontextmanager
async def backlog_shown(
    web: WebProcess, requests: list[AskUserQuestionRequest], shown: Callable[[], Awaitable[int]], within: float
) -> AsyncIterator[Backlog]:
    """Ask every one of ``requests`` (no deadline) and wait until ``shown()`` counts them all on the web
    server; they are cancelled on exit."""
    async with Broker(web.redis_url, web.namespace, **KEYS) as asker:
        asks = [asyncio.create_task(asker.ask(request, abort=None, timeout=300)) for request in requests]
        async with asyncio.timeout(within):
            while await shown() < len(requests):
                await asyncio.sleep(0.2)
        try:
            yield asker, asks
        finally:
            for task in asks:
                task.cancel()
            await asyncio.gather(*asks, return_exceptions=True)


@pytest.fixture
def start_web(redis_server: RedisServer, namespace: str, tmp_path: Path) -> Iterator[Callable[..., WebProcess]]:
    started: list[WebProcess] = []
    users_file = write_users_file(tmp_path / "users.toml")

    def start(name: str = "web-1", *extra: str) -> WebProcess:
        web = WebProcess(
            redis_server.url, namespace, users_file, tmp_path / f"{name}.log", name=name, extra=list(extra)
        ).start()
        started.append(web)
        return web

    yield start
    for web in started:
        web.stop()
