"""A Redis for the demo when no URL is given: a private redis-server, else fakeredis in-process."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from workers.redis_server import RedisServer

__all__ = ["EmbeddedRedis", "embedded_redis"]


@dataclass(frozen=True)
class EmbeddedRedis:
    description: str
    url: str
    connect: Callable[[], Redis] | None


@contextlib.contextmanager
def embedded_redis() -> Iterator[EmbeddedRedis]:
    binary = shutil.which("redis-server")
    if binary is not None:
        with tempfile.TemporaryDirectory(prefix="qbroker-") as directory:
            server = RedisServer(Path(directory)).start()
            try:
                yield EmbeddedRedis(f"a private redis-server ({binary}) on {server.url}", server.url, None)
            finally:
                server.kill()
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
