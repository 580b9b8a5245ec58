"""A Redis for the demo when no URL is given: a private redis-server, else fakeredis in-process."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from redis.asyncio import Redis

__all__ = ["EmbeddedRedis", "embedded_redis"]


@dataclass(frozen=True)
class EmbeddedRedis:
    description: str
    url: str
    connect: Callable[[], Redis] | None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            if sock.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.02)
    raise OSError(f"the private redis-server on port {port} did not start")


@contextlib.contextmanager
def embedded_redis() -> Iterator[EmbeddedRedis]:
    server = shutil.which("redis-server")
    if server is not None:
        port = _free_port()
        with tempfile.TemporaryDirectory(prefix="qbroker-") as directory:
            args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", directory]
            process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                _wait_ready(port, process)
                url = f"redis://127.0.0.1:{port}/0"
                yield EmbeddedRedis(f"a private redis-server ({server}) on {url}", url, None)
            finally:
                process.terminate()
                process.wait()
        return
    try:
        import fakeredis
    except ImportError as error:
        raise OSError(
            "no redis-server installed and fakeredis missing: pip install 'question-broker[embedded]'"
        ) from error
    fake = fakeredis.FakeServer()
    yield EmbeddedRedis(
        "fakeredis in this process (no redis-server installed)",
        "redis://fakeredis",
        lambda: fakeredis.FakeAsyncRedis(server=fake, decode_responses=True),
    )
