"""An asking process that cannot connect says why (issue 27), each against a real redis-server.

Before, a full server (``maxclients``) was "Redis did not answer within 5s", its real cause
only in a warning: the broker now names the last refusal it met while it tried.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from broker import Broker, UserQuestionError
from broker.errors import BROKER_UNAVAILABLE
from tests.helpers import KEYS
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(30)


async def refusal(url: str, connect_timeout: float = 2.0) -> tuple[UserQuestionError, float]:
    started = time.monotonic()
    with pytest.raises(UserQuestionError) as raised:
        async with Broker(url, "connect-errors", connect_timeout=connect_timeout, **KEYS):
            pass
    return raised.value, time.monotonic() - started


async def test_a_full_server_says_max_number_of_clients_reached(redis_factory: Callable[..., RedisServer]):
    server = redis_factory()
    admin = Redis.from_url(server.url, decode_responses=True)
    try:
        await admin.config_set("maxclients", 1)  # the admin connection is the one
        error, elapsed = await refusal(server.url)
    finally:
        await admin.config_set("maxclients", 10000)
        await admin.aclose()
    assert error.code == BROKER_UNAVAILABLE
    assert "max number of clients reached" in error.message, error.message
    assert elapsed < 2.0 + 1.5


@pytest.mark.parametrize("password", ["wrong", None], ids=["wrong-password", "no-password"])
async def test_a_refused_password_says_so_at_once(redis_factory: Callable[..., RedisServer], password: str | None):
    server = redis_factory()
    async with Redis.from_url(server.url) as admin:
        await admin.config_set("requirepass", "s3cret")
    url = server.url if password is None else server.url.replace("redis://", f"redis://:{password}@")
    error, elapsed = await refusal(url)
    assert error.code == BROKER_UNAVAILABLE
    assert any(word in error.message for word in ("WRONGPASS", "invalid", "NOAUTH", "Authentication")), error.message
    assert "s3cret" not in error.message and "wrong" not in error.message.replace("wrong password", "")
    assert elapsed < 1.5


async def test_an_unknown_host_names_the_host():
    error, elapsed = await refusal(f"redis://no-such-host.invalid:{free_port()}/0")
    assert error.code == BROKER_UNAVAILABLE
    assert "no-such-host.invalid" in error.message, error.message
    assert elapsed < 2.0 + 1.5


async def test_a_closed_port_says_the_connection_was_refused():
    error, _ = await refusal(f"redis://127.0.0.1:{free_port()}/0")
    assert error.code == BROKER_UNAVAILABLE
    assert "refused" in error.message.lower(), error.message
