"""The gateway at fleet size (issue 27): what ``python -m benchmarks.gateway`` showed breaking.

In process (``Gateway`` over a real ``Broker`` and redis-server) where the contract is the
gateway's own bookkeeping; as a real process for its file descriptor limit.
"""

from __future__ import annotations

import asyncio
import re
import resource
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from broker import Broker
from tests.redis_server import RedisServer
from tests.workers.procs import env_for
from tests.workers.test_gateway import YES_NO, answering
from workers.asking.gateway.listen import listen_tcp
from workers.asking.gateway.service import Gateway
from workers.asking.gateway.tokens import TOKEN_PREFIX, Tokens, new_token, revoke_tokens

pytestmark = [pytest.mark.timeout(30)]


async def test_consecutive_asks_of_an_agent_share_one_registration(
    make_broker: Callable[..., Awaitable[Broker]], redis: Redis
) -> None:
    # Registering the agent anew for each ask cost a round trip per ask of an agent asking one
    # question at a time; the record now stays while the agent keeps asking, and goes soon after.
    asker, provider = await make_broker(), await make_broker()
    agent_key = asker.keys.agent("ci-bot")
    async with answering(provider), Gateway(asker, agent_linger=1.0) as gateway:
        first = await gateway.ask("ci-bot", {"request": YES_NO})
        await gateway.wait(first, 10)
        assert first.state == "answered"
        await asyncio.sleep(0.3)  # the removal, had it been released, would be done by now
        assert await redis.exists(agent_key) == 1
        second = await gateway.ask("ci-bot", {"request": YES_NO})
        await gateway.wait(second, 10)
        assert second.state == "answered"
        async with asyncio.timeout(5):
            while await redis.exists(agent_key):
                await asyncio.sleep(0.05)


async def test_an_agents_asks_are_found_among_many_agents(make_broker: Callable[..., Awaitable[Broker]]) -> None:
    asker, provider = await make_broker(), await make_broker()
    async with answering(provider, None), Gateway(asker, max_asks=2) as gateway:
        started = [await gateway.ask(f"agent-{n % 5}", {"request": YES_NO, "coalesce": False}) for n in range(10)]
        assert [ask.agent_id for ask in gateway.asks_of("agent-3")] == ["agent-3", "agent-3"]
        with pytest.raises(Exception, match="2 asks pending already"):
            await gateway.ask("agent-3", {"request": YES_NO})
        for ask in started[:5]:
            await gateway.withdraw(ask)
        assert len(gateway.asks_of("agent-3")) == 2  # finished ones stay readable for keep_for
        await gateway.ask("agent-3", {"request": YES_NO})


def _limits(pid: int) -> str:
    return Path(f"/proc/{pid}/limits").read_text()


@pytest.mark.slow
async def test_the_gateway_raises_its_open_file_limit_to_the_hard_limit(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> None:
    # 1 000 agents long-polling need 1 000 sockets: a soft limit of 1 024 (common) would refuse the next.
    tokens = tmp_path / "tokens"
    new_token(tokens, "ci-bot")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 64:
        pytest.skip("the hard limit leaves nothing to raise")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers", "gateway", "--tokens-file", str(tokens), "--port", "0",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=env_for(redis_server.url, namespace),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard)),
    )  # fmt: skip
    try:
        assert process.stderr is not None
        async with asyncio.timeout(20):
            while b"listening on" not in (line := await process.stderr.readline()):
                assert line, "the gateway ended before listening"
        found = re.search(r"Max open files\s+(\d+)\s+(\d+)", _limits(process.pid))
        assert found is not None and int(found.group(1)) == hard == int(found.group(2))
    finally:
        process.terminate()
        assert await process.wait() == 0


def test_each_of_many_agents_tokens_finds_its_own_agent(tmp_path: Path) -> None:
    # Found by digest in one step (every entry compared cost 0.2 ms a request at 1 000 agents):
    # still each token its own agent, and no near guess, missing prefix or bare digest finds one.
    path = tmp_path / "tokens"
    issued = {f"agent-{n}": new_token(path, f"agent-{n}") for n in range(200)}
    tokens = Tokens(path)
    assert all(tokens.agent_for(token) == agent for agent, token in issued.items())
    token = issued["agent-7"]
    assert tokens.agent_for(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert tokens.agent_for(token.removeprefix(TOKEN_PREFIX)) is None
    assert tokens.agent_for(path.read_text().split()[1]) is None
    assert tokens.agent_for("") is None
    revoke_tokens(path, "agent-7")
    assert tokens.agent_for(token) is None and tokens.agent_for(issued["agent-8"]) == "agent-8"


async def test_connections_the_gateway_accepts_send_without_nagles_delay() -> None:
    # With Nagle's algorithm on, every reply on a kept-alive connection waited 40 ms for the client's
    # delayed ACK (a client reading its answers over one connection: p50 44 ms instead of 0.4 ms).
    listener = listen_tcp("127.0.0.1", 0)
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
    try:
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        async with asyncio.timeout(10):
            assert await accepted != 0
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
