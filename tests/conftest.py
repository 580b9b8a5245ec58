from __future__ import annotations

import itertools
import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import Provider
from tests.file_order import longest_files_first
from tests.helpers import SIGNING_KEY, opened_brokers
from tests.redis_server import RedisServer

# Bytecode caches on, whatever the environment says (PYTHONDONTWRITEBYTECODE=1, as container images often set):
# the suite is CPU-bound on two cores, and without them each xdist process rewrites every test module's asserts
# anew (collecting took 23 s of CPU per process, 14 s with the caches) and each of the processes the tests start
# compiles the project anew. Caches are gitignored; tests/mutate.py's copies get fresh ones.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Every qbroker process a test starts signs (providers) and verifies (askers) with the tests' key.
os.environ["QBROKER_SIGNING_KEY"] = SIGNING_KEY.to_text()
os.environ["QBROKER_TRUSTED_KEYS"] = SIGNING_KEY.public_text

_namespaces = itertools.count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, for ``-n 3 --dist loadfile`` to end its processes together (tests/file_order.py)."""
    items[:] = longest_files_first(items)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.kill()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start private servers (to kill, pause or restart); all are stopped at teardown."""
    servers: list[RedisServer] = []

    def start(*extra: str) -> RedisServer:
        server = RedisServer(tmp_path / f"redis{len(servers)}", *extra).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.process is not None:
            server.resume()
        server.kill()


@pytest.fixture
def namespace() -> str:
    return f"t{os.getpid()}-{next(_namespaces)}"


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """Where ``make_broker``'s brokers connect: the shared server (a module of another topology overrides it)."""
    return redis_server.url


@pytest.fixture
async def make_broker(redis_url: str, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    """Open brokers on ``redis_url`` (same namespace unless told); closed at teardown."""
    async with opened_brokers(redis_url, namespace) as make:
        yield make


@pytest.fixture
async def answering(make_broker: Callable[..., Any]) -> AsyncIterator[Provider]:
    """A provider named ``ui`` holding the test's namespace."""
    broker = await make_broker()
    async with broker.provider("ui") as provider:
        yield provider
