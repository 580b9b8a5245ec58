"""The processes behind ``qbroker quickstart`` (and the interactive demo): Redis, keys, a user, web, worker.

Each process is a real ``qbroker`` command started with the environment an operator would give
it, in its own session (Ctrl-C reaches only this process, which stops them in order: the page
and the worker before the Redis they use). Their output goes to log files in the directory, and
the tail of a log is shown when its process fails to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from broker.signing import SigningKey
from workers.answering.web.config import hash_password
from workers.redis_server import RedisServer

__all__ = ["QuickstartError", "Team", "serve", "team"]

_STARTUP_S = 30.0
_STOP_S = 10.0


class QuickstartError(Exception):
    """Something the quick start needs is missing or failed to start (the message says what to do)."""


@dataclass(frozen=True, kw_only=True)
class Team:
    """A running set-up: where the page is, who may sign in, what an asker needs."""

    redis_url: str = field(repr=False)
    redis_description: str
    namespace: str
    page_url: str
    user: str
    password: str = field(repr=False)
    directory: Path
    public_key: str
    trusted_keys_file: Path
    logs: tuple[Path, ...]
    processes: tuple[asyncio.subprocess.Process, ...] = field(repr=False)


@contextlib.asynccontextmanager
async def team(
    *,
    redis_url: str | None,
    namespace: str,
    host: str,
    port: int,
    user: str,
    directory: Path | None,
    worker: bool,
    redis_description: str = "",
) -> AsyncIterator[Team]:
    """Start everything; on exit stop it all (children first, then a private Redis)."""
    with contextlib.ExitStack() as cleanup:
        if directory is None:
            directory = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="qbroker-quickstart-")))
        directory.mkdir(parents=True, exist_ok=True)
        if redis_url is None:
            binary = shutil.which("redis-server")
            if binary is None:
                raise QuickstartError(
                    "no redis-server on PATH: install one (apt-get install -y redis-server, brew install redis) "
                    "or name a Redis with --redis-url / QBROKER_REDIS_URL"
                )
            server = RedisServer(directory / "redis").start()
            cleanup.callback(server.kill)
            redis_url, redis_description = server.url, f"a private redis-server ({binary}) on {server.url}"
        key_file, public_file = _keys(directory, namespace)
        password = secrets.token_urlsafe(12)
        users_file = directory / "users.toml"
        users_file.write_text(f"[users]\n{json.dumps(user)} = {json.dumps(hash_password(password))}\n")
        os.chmod(users_file, 0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")}
        env.update(
            QBROKER_REDIS_URL=redis_url,
            QBROKER_NAMESPACE=namespace,
            QBROKER_SIGNING_KEY_FILE=str(key_file),
            QBROKER_TRUSTED_KEYS_FILE=str(public_file),
            QBROKER_WEB_USERS=str(users_file),
            QBROKER_LOG_LEVEL="INFO",
        )
        commands = [("web", ["web", "--host", host, "--port", str(port), "--name", f"web@{socket.gethostname()}"])]
        if worker:
            commands.append(("worker", ["worker"]))
        processes: list[asyncio.subprocess.Process] = []
        logs: list[Path] = []
        try:
            for name, args in commands:
                log_path = directory / f"{name}.log"
                with log_path.open("wb") as log_file:
                    processes.append(
                        await asyncio.create_subprocess_exec(
                            sys.executable,
                            "-m",
                            "workers",
                            *args,
                            stdin=asyncio.subprocess.DEVNULL,
                            stdout=log_file,
                            stderr=log_file,
                            env=env,
                            start_new_session=True,
                        )
                    )
                logs.append(log_path)
            page = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
            await _wait_healthy(page, processes, logs)
            yield Team(
                redis_url=redis_url,
                redis_description=redis_description or redis_url.split("@")[-1],
                namespace=namespace,
                page_url=page,
                user=user,
                password=password,
                directory=directory,
                public_key=public_file.read_text().strip(),
                trusted_keys_file=public_file,
                logs=tuple(logs),
                processes=tuple(processes),
            )
        finally:
            await _stop(processes)


def _keys(directory: Path, namespace: str) -> tuple[Path, Path]:
    """The namespace's key pair in ``directory``: kept ones reused (askers already trust them)."""
    key_file, public_file = directory / f"{namespace}.key", directory / f"{namespace}.pub"
    if key_file.exists():
        key = SigningKey.from_text(key_file.read_text())
    else:
        key = SigningKey.generate()
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(key.to_text() + "\n")
    public_file.write_text(key.public_text + "\n")
    return key_file, public_file


async def _wait_healthy(page: str, processes: list[asyncio.subprocess.Process], logs: list[Path]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _STARTUP_S
    while True:
        for process, log_path in zip(processes, logs, strict=True):
            if process.returncode is not None:
                raise QuickstartError(f"{log_path.stem} exited with status {process.returncode}:\n{_tail(log_path)}")
        if await asyncio.to_thread(_healthy, page):
            return
        if loop.time() > deadline:
            raise QuickstartError(f"the page did not answer on {page} within {_STARTUP_S:g}s:\n{_tail(logs[0])}")
        await asyncio.sleep(0.2)


def _healthy(page: str) -> bool:
    try:
        with urllib.request.urlopen(f"{page}/healthz", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


async def _stop(processes: list[asyncio.subprocess.Process]) -> None:
    for process in reversed(processes):
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
    for process in processes:
        try:
            await asyncio.wait_for(process.wait(), _STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def banner(running: Team) -> str:
    """What a person needs: the page, the sign-in, and how a shell asks."""
    return (
        f"question-broker is running: namespace {running.namespace}, Redis {running.redis_description}\n"
        f"\n"
        f"  Page:      {running.page_url}\n"
        f"  User:      {running.user}\n"
        f"  Password:  {running.password}\n"
        f"\n"
        f"Ask from another shell:\n"
        f"  export QBROKER_REDIS_URL={running.redis_url} QBROKER_NAMESPACE={running.namespace} "
        f"QBROKER_TRUSTED_KEYS_FILE={running.trusted_keys_file}\n"
        f'  qbroker ask -q "Deploy now?" -o yes -o no\n'
        f"\n"
        f"Logs: {', '.join(str(p) for p in running.logs)}. Ctrl-C stops everything."
    )


async def serve(
    *,
    redis_url: str | None,
    namespace: str,
    host: str,
    port: int,
    user: str,
    directory: Path | None,
    worker: bool,
) -> int:
    """Run until SIGINT or SIGTERM (0), or until a process stops by itself (1)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        started = team(
            redis_url=redis_url,
            namespace=namespace,
            host=host,
            port=port,
            user=user,
            directory=directory,
            worker=worker,
        )
        async with started as running:
            print(banner(running), flush=True)
            waits = [asyncio.ensure_future(p.wait()) for p in running.processes]
            stopping = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait([stopping, *waits], return_when=asyncio.FIRST_COMPLETED)
            for future in [stopping, *waits]:
                future.cancel()
            if stopping in done:
                print("stopping...", flush=True)
                return 0
            for process, log_path in zip(running.processes, running.logs, strict=True):
                if process.returncode is not None:
                    stopped = f"{log_path.stem} stopped (status {process.returncode})"
                    print(f"qbroker quickstart: {stopped}:\n{_tail(log_path)}", file=sys.stderr)
            return 1
    except QuickstartError as error:
        print(f"qbroker quickstart: {error}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
