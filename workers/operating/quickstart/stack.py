"""The processes behind ``qbroker quickstart`` (and the interactive demo): Redis, keys, a user, web, worker, gateway.

Each process is a real ``qbroker`` command started with the environment an operator would give
it, in its own session (Ctrl-C and a closed terminal's SIGHUP reach only quickstart, which stops
them in order: the page, the worker and the gateway before the Redis they use). Each connects to a
private Redis as its own role's user (asker: the gateway; answerer: the page; maintenance: the
worker), and agents ask through the gateway with a token: nothing handed to an asking shell can
write to Redis what only the page may (a web session, an answer). The keys, the users file and the
token's digest live in a directory only its owner can read, removed on exit unless it was named;
a guard process stops everything and removes it if quickstart is killed outright
(``workers.operating.quickstart.guard``). Output goes to log files in the directory, and the tail
of a log is shown when its process fails to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
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
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from broker.errors import PORT_IN_USE
from broker.roles import ROLES
from broker.signing import SigningKey
from workers.asking.gateway.tokens import new_token
from workers.exits import EXIT_STATUS
from workers.operating.quickstart.guard import Guard, guarding
from workers.operating.quickstart.private_redis import PrivateRedis, write_private
from workers.passwords import hash_password
from workers.redis_server import free_port

__all__ = ["QuickstartError", "Team", "TeamPlan", "serve", "team"]

_STARTUP_S = 30.0
_STOP_S = 10.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class QuickstartError(Exception):
    """Something the quick start needs is missing or failed to start (the message says what to do)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code

    def __str__(self) -> str:
        message = super().__str__()
        return f"{self.code}: {message}" if self.code else message


@dataclass(frozen=True, kw_only=True)
class Team:
    """A running set-up: where the page is, who may sign in, how an agent asks."""

    redis_description: str
    namespace: str
    page_url: str
    user: str
    password: str = field(repr=False)
    directory: Path
    kept: bool
    """the directory stays after exit (``--dir``)"""
    public_key: str
    trusted_keys_file: Path
    gateway_url: str | None
    agent: str
    gateway_token: str = field(repr=False)
    role_files: tuple[Path, ...]
    """each role's Redis URL (private Redis only), for operators and trusted askers"""
    logs: tuple[Path, ...]
    processes: tuple[asyncio.subprocess.Process, ...] = field(repr=False)


def _check_ports(ports: Mapping[str, tuple[str, int]]) -> None:
    """Each port free before anything starts: a taken one (a stack left running, say) is PORT_IN_USE,
    and not mistaken for ours when it answers."""
    seen: dict[int, str] = {}
    for what, (host, port) in ports.items():
        if port in seen:
            raise QuickstartError(f"port {port} is given to both {seen[port]} and {what}", PORT_IN_USE)
        seen[port] = what
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: TIME_WAIT is free
            try:
                probe.bind((host, port))
            except OSError as error:
                if error.errno != errno.EADDRINUSE:
                    raise QuickstartError(f"cannot listen on {host}:{port} ({what}): {error.strerror}") from None
                raise QuickstartError(
                    f"port {port} ({what}) is taken on {host}: stop what listens there (a quickstart left "
                    f"running?) or choose another port",
                    PORT_IN_USE,
                ) from None


def _make_directory(directory: Path | None) -> tuple[Path, bool]:
    """The directory of the keys: named (kept, made 0700 when new), else a new private temporary one."""
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="qbroker-quickstart-")), False  # 0700
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory, True


def _key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """The key pair ``name`` in ``directory``: a kept one reused (askers and pages already trust it)."""
    key_file, public_file = directory / f"{name}.key", directory / f"{name}.pub"
    if key_file.exists():
        key = SigningKey.from_text(key_file.read_text())
    else:
        key = SigningKey.generate()
        write_private(key_file, key.to_text() + "\n")
    write_private(public_file, key.public_text + "\n")
    return key_file, public_file


def _agent_token(directory: Path, agent: str) -> tuple[Path, str]:
    """A new token for ``agent`` in a new tokens file: a kept directory's earlier tokens stop working."""
    tokens_file = directory / "gateway.tokens"
    tokens_file.unlink(missing_ok=True)
    return tokens_file, new_token(tokens_file, agent)


def _role_files(directory: Path, redis: PrivateRedis, namespace: str, keys: Mapping[str, Path]) -> tuple[Path, ...]:
    """``ROLE.env``: each role's settings, to source for an operator's command or a trusted asker."""
    files = []
    for role in ROLES:
        settings = {"QBROKER_REDIS_URL": redis.url(role), "QBROKER_NAMESPACE": namespace}
        settings["QBROKER_TRUSTED_KEYS_FILE"] = str(keys["public"])
        if role == "answerer":
            settings["QBROKER_SIGNING_KEY_FILE"] = str(keys["secret"])
        path = directory / f"{role}.env"
        write_private(path, "".join(f"{name}={value}\n" for name, value in settings.items()))
        files.append(path)
    return tuple(files)


@dataclass(frozen=True, kw_only=True)
class _Gateway:
    url: str
    token: str = field(repr=False)
    public_file: Path
    """the gateway's own public key, which the page pins: it shows the gateway's asks as verified"""
    args: list[str]
    env: dict[str, str] = field(repr=False)


def _gateway(directory: Path, agent: str, port: int, asker_url: str, trusted_keys_file: Path) -> _Gateway:
    """``qbroker gateway`` on ``127.0.0.1:port`` as the asker, with a new token for ``agent`` and its own key."""
    (directory / "gateway").mkdir(mode=0o700, exist_ok=True)  # apart from NS.key, whatever the namespace's name
    attest_key, attest_public = _key_pair(directory / "gateway", "attest")
    tokens_file, token = _agent_token(directory, agent)
    args = ["gateway", "--tokens-file", str(tokens_file), "--attest-key-file", str(attest_key)]
    return _Gateway(
        url=f"http://127.0.0.1:{port}",
        token=token,
        public_file=attest_public,
        args=[*args, "--host", "127.0.0.1", "--port", str(port)],
        env={"QBROKER_REDIS_URL": asker_url, "QBROKER_TRUSTED_KEYS_FILE": str(trusted_keys_file)},
    )


async def _spawn(args: list[str], env: dict[str, str], log_path: Path) -> asyncio.subprocess.Process:
    """``qbroker ARGS`` in a session of its own (Ctrl-C and SIGHUP reach quickstart only), logging to ``log_path``."""
    log_file = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "workers",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=env,
            start_new_session=True,
            umask=0o077,
        )
    finally:
        os.close(log_file)


@dataclass(frozen=True, kw_only=True)
class TeamPlan:
    """What to start: ``redis_url`` None for a private redis-server with one user per role (on
    ``redis_port``, or a free one); ``gateway_port`` None for no gateway; ``directory`` None for a
    temporary one, removed on exit."""

    redis_url: str | None
    namespace: str
    host: str
    port: int
    user: str
    directory: Path | None
    worker: bool
    gateway_port: int | None = None
    redis_port: int | None = None
    agent: str = "agent"
    redis_description: str = ""
    """how the banner names a given Redis ('' for its URL's host)"""


def _preflight(plan: TeamPlan) -> tuple[str | None, int | None]:
    """The redis-server binary to start (None for a given Redis) and its port; every port checked free."""
    binary = None
    redis_port = plan.redis_port
    if plan.redis_url is None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise QuickstartError(
                "no redis-server on PATH: install one (apt-get install -y redis-server, brew install redis) "
                "or name a Redis with --redis-url / QBROKER_REDIS_URL"
            )
        redis_port = redis_port or free_port()
    ports = {"the page": (plan.host or "0.0.0.0", plan.port)}
    if plan.gateway_port is not None:
        ports["the gateway"] = ("127.0.0.1", plan.gateway_port)
    if redis_port is not None and binary is not None:
        ports["the private Redis"] = ("127.0.0.1", redis_port)
    _check_ports(ports)
    return binary, redis_port


@dataclass(frozen=True, kw_only=True)
class _Redis:
    role_urls: dict[str, str] = field(repr=False)
    """each role's Redis URL"""
    role_files: tuple[Path, ...]
    description: str


async def _private_redis(
    cleanup: contextlib.AsyncExitStack,
    guard: Guard,
    binary: str,
    port: int,
    directory: Path,
    namespace: str,
    keys: Mapping[str, Path],
) -> _Redis:
    """A redis-server of our own, one user per role, stopped when ``cleanup`` unwinds."""
    redis = PrivateRedis(binary, directory / "redis", namespace, port)
    cleanup.push_async_callback(redis.stop)
    await guard.watch((await redis.start()).pid)
    if not await redis.wait_ready():
        raise QuickstartError(f"redis-server did not start on {redis.address}:\n{_tail(redis.log)}")
    return _Redis(
        role_urls={role: redis.url(role) for role in ROLES},
        role_files=_role_files(directory, redis, namespace, keys),
        description=f"a private redis-server ({binary}) on {redis.address}, its default user off",
    )


def _pin_gateway_key(role_files: tuple[Path, ...], public_file: Path) -> None:
    """An operator's `qbroker status` (maintenance.env) and the answerer show the gateway's agents as verified."""
    for role_file in role_files:
        if role_file.stem in ("answerer", "maintenance"):
            with role_file.open("a", encoding="utf-8") as env_file:
                env_file.write(f"QBROKER_GATEWAY_KEYS_FILE={public_file}\n")


def _commands(
    plan: TeamPlan,
    redis: _Redis,
    keys: Mapping[str, Path],
    users_file: Path,
    gateway: _Gateway | None,
    private: bool,
) -> list[tuple[str, list[str], dict[str, str]]]:
    """Each child's name, ``qbroker`` arguments and environment: the page, the worker, the gateway."""
    web_env = {
        "QBROKER_REDIS_URL": redis.role_urls["answerer"],
        "QBROKER_SIGNING_KEY_FILE": str(keys["secret"]),
        "QBROKER_TRUSTED_KEYS_FILE": str(keys["public"]),
        "QBROKER_WEB_USERS": str(users_file),
    }
    if gateway is not None:
        web_env["QBROKER_GATEWAY_KEYS_FILE"] = str(gateway.public_file)  # the page shows its agents as verified
    web_args = ["web", "--host", plan.host, "--port", str(plan.port), "--name", f"web@{socket.gethostname()}"]
    commands = [("web", web_args, web_env)]
    if plan.worker:
        worker_env = {"QBROKER_REDIS_URL": redis.role_urls["maintenance"]}
        if private:  # its user may write arq's queue under the namespace's name only
            worker_env["QBROKER_ARQ_QUEUE"] = f"qbroker:{plan.namespace}"
        commands.append(("worker", ["worker"], worker_env))
    if gateway is not None:
        commands.append(("gateway", gateway.args, gateway.env))
    return commands


@contextlib.asynccontextmanager
async def team(plan: TeamPlan) -> AsyncIterator[Team]:
    """Start everything; on exit stop it all (children first, then a private Redis, then the directory)."""
    page_host = "127.0.0.1" if plan.host in ("0.0.0.0", "") else plan.host
    binary, redis_port = _preflight(plan)
    async with contextlib.AsyncExitStack() as cleanup:
        guard = await cleanup.enter_async_context(guarding())
        directory, kept = _make_directory(plan.directory)
        if not kept:
            await guard.remove(directory)
            cleanup.callback(shutil.rmtree, directory, ignore_errors=True)
        key_file, public_file = _key_pair(directory, plan.namespace)
        keys = {"secret": key_file, "public": public_file}
        redis = _Redis(role_urls=dict.fromkeys(ROLES, plan.redis_url or ""), role_files=(), description="")
        if binary is not None:
            assert redis_port is not None
            redis = await _private_redis(cleanup, guard, binary, redis_port, directory, plan.namespace, keys)
        processes: list[asyncio.subprocess.Process] = []
        logs: list[Path] = []
        cleanup.push_async_callback(_stop, processes)  # (the stack unwinds last in, first out) before their Redis
        password = secrets.token_urlsafe(12)
        users_file = directory / "users.toml"
        write_private(users_file, f"[users]\n{json.dumps(plan.user)} = {json.dumps(hash_password(password))}\n")
        base = {k: v for k, v in os.environ.items() if not k.startswith("QBROKER_")}
        base.update(QBROKER_NAMESPACE=plan.namespace, QBROKER_LOG_LEVEL="INFO")
        gateway: _Gateway | None = None
        if plan.gateway_port is not None:
            gateway = _gateway(directory, plan.agent, plan.gateway_port, redis.role_urls["asker"], public_file)
            _pin_gateway_key(redis.role_files, gateway.public_file)
        for name, args, env in _commands(plan, redis, keys, users_file, gateway, private=binary is not None):
            log_path = directory / f"{name}.log"
            process = await _spawn(args, base | env, log_path)
            processes.append(process)
            logs.append(log_path)
            await guard.watch(process.pid)
        page = f"http://{page_host}:{plan.port}"
        gateway_url = gateway.url if gateway else None
        await _wait_healthy([page, *([gateway_url] if gateway_url else [])], processes, logs)
        yield Team(
            redis_description=redis.description or plan.redis_description or (plan.redis_url or "").split("@")[-1],
            namespace=plan.namespace,
            page_url=page,
            password=password,
            user=plan.user,
            directory=directory,
            kept=kept,
            public_key=public_file.read_text().strip(),
            trusted_keys_file=public_file,
            gateway_url=gateway_url,
            agent=plan.agent,
            gateway_token=gateway.token if gateway else "",
            role_files=redis.role_files,
            logs=tuple(logs),
            processes=tuple(processes),
        )


async def _wait_healthy(urls: list[str], processes: list[asyncio.subprocess.Process], logs: list[Path]) -> None:
    """Every URL's ``/healthz`` answers 200 while every process still runs (one that exited: its log)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _STARTUP_S
    waiting = list(urls)
    while True:
        for process, log_path in zip(processes, logs, strict=True):
            if process.returncode is not None:
                raise QuickstartError(f"{log_path.stem} exited with status {process.returncode}:\n{_tail(log_path)}")
        healthy = [url for url in waiting if await asyncio.to_thread(_healthy, url)]
        waiting = [url for url in waiting if url not in healthy]
        if not waiting:
            return
        if loop.time() > deadline:
            raise QuickstartError(f"{waiting[0]} did not answer within {_STARTUP_S:g}s:\n{_tail(logs[0])}")
        await asyncio.sleep(0.2)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1) as response:
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
    """What a person needs: the page, the sign-in, how an agent asks, where the keys are."""
    lines = [
        f"question-broker is running: namespace {running.namespace}, Redis {running.redis_description}",
        "",
        f"  Page:      {running.page_url}",
        f"  User:      {running.user}",
        f"  Password:  {running.password}",
    ]
    if running.gateway_url:
        lines += [
            f"  Gateway:   {running.gateway_url} (its token asks as agent {running.agent!r})",
            "",
            "Ask from another shell (the gateway and a token: no Redis credentials, no key):",
            f"  export QBROKER_GATEWAY_URL={running.gateway_url} QBROKER_GATEWAY_TOKEN={running.gateway_token}",
            '  qbroker ask -q "Deploy now?" -o yes -o no',
        ]
    lines.append("")
    if running.role_files:
        lines.append(
            f"Each role's Redis user is in {running.directory}/ROLE.env (asker, answerer, maintenance): "
            f"`set -a; . {running.directory}/maintenance.env; set +a` before `qbroker status`."
        )
    kept = "kept" if running.kept else "removed on exit (--dir DIR keeps them)"
    lines.append(f"Keys, users file and token digest: {running.directory} (0700), {kept}.")
    lines.append(f"Logs: {', '.join(str(p) for p in running.logs)}. Ctrl-C stops everything.")
    return "\n".join(lines)


def _say(text: str, *, error: bool = False) -> None:
    """Print, unless the terminal is gone (a SIGHUP's): stopping must go on whatever stdout is."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr if error else sys.stdout, flush=True)


async def _session(started: contextlib.AbstractAsyncContextManager[Team]) -> int:
    """Start the team, say so, and run until one of its processes stops by itself (1)."""
    try:
        async with started as running:
            _say(banner(running))
            waits = {asyncio.ensure_future(p.wait()): p for p in running.processes}
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for future in waits:
                    future.cancel()
            for process, log_path in zip(running.processes, running.logs, strict=True):
                if process.returncode is not None:
                    stopped = f"{log_path.stem} stopped (status {process.returncode})"
                    _say(f"qbroker quickstart: {stopped}:\n{_tail(log_path)}", error=True)
            return 1
    except QuickstartError as error:
        _say(f"qbroker quickstart: {error}", error=True)
        return EXIT_STATUS[error.code] if error.code else 1


async def serve(plan: TeamPlan) -> int:
    """Run until SIGINT, SIGTERM or SIGHUP (0), or until a process stops by itself (1).

    A signal during the start stops what has started as well: the start is cancelled, and each
    step's clean-up (processes, Redis, directory, guard) runs as it unwinds.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in _STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    started = team(plan)
    session = asyncio.ensure_future(_session(started))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([session, stopping], return_when=asyncio.FIRST_COMPLETED)
        if session.done():
            return session.result()
        _say("stopping...")
        session.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await session
        return 0
    finally:
        stopping.cancel()
        for signum in _STOP_SIGNALS:
            loop.remove_signal_handler(signum)
