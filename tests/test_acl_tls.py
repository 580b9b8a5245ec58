"""Access control against a real Redis: ACL users fenced to one namespace, and TLS (rediss://)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError, NoPermissionError

from broker import Agent, Broker, Remember, UserQuestionError
from broker._lua import SCRIPTS
from broker.connection import redis_from_url
from broker.errors import BROKER_UNAVAILABLE
from tests.helpers import KEYS, next_pending, one_question, pick
from tests.redis_server import RedisServer, free_port

# What a broker needs, and nothing that reaches outside its keys or disturbs the server. SCAN
# is not key-checked by ACLs (it would list other namespaces' key names), so it is refused too.
BROKER_COMMANDS = (
    "-@all +@read +@write +@stream +@list +@hash +@string +@keyspace "
    "+evalsha +eval +ping +time +client|setname +client|id -@dangerous -scan"
)


async def make_user(admin: Redis, namespace: str, password: str) -> str:
    await admin.execute_command(
        "ACL", "SETUSER", namespace, "reset", "on", f">{password}", f"~qb:{{{namespace}}}:*", *BROKER_COMMANDS.split()
    )
    return namespace


@pytest.fixture
async def acl_server(redis_factory) -> RedisServer:
    server = redis_factory()
    admin = Redis(host="127.0.0.1", port=server.port, decode_responses=True)
    try:
        await make_user(admin, "team-a", "pw-a")
        await make_user(admin, "team-b", "pw-b")
        await admin.execute_command("ACL", "SETUSER", "default", "off")  # nobody unnamed
    finally:
        await admin.aclose()
    return server


def forged_settle(client: Redis, keys: Any, request_id: str, client_id: str) -> Any:
    """The settle script run on another namespace's keys with a made-up fence."""
    script_keys = [
        keys.provider, keys.requests, keys.audit, keys.decisions, keys.decision_expiry, keys.request(request_id),
        keys.outcome(request_id), keys.inbox(client_id), keys.request(request_id),
    ]  # fmt: skip
    args = [
        "1:x:",
        "thief",
        1,
        "providers",
        10,
        1000,
        "0",
        request_id,
        "answered",
        "{}",
        "thief",
        "c1",
        "claimed",
        "",
        "",
        0,
    ]
    return client.execute_command("EVAL", SCRIPTS["settle"].source, len(script_keys), *script_keys, *args)


def url_for(server: RedisServer, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}/0"


def open_broker(url: str, namespace: str) -> Broker:
    return Broker(url, namespace, **KEYS)


@contextlib.asynccontextmanager
async def team_a(server: RedisServer) -> AsyncIterator[tuple[Agent, Broker]]:
    """Agent 'root' of an asking broker, and an answering broker, both as team A's ACL user in its namespace."""
    url = url_for(server, "team-a", "pw-a")
    async with (
        open_broker(url, "team-a") as asking,
        open_broker(url, "team-a") as answering,
        asking.agent("root") as agent,
    ):
        yield agent, answering


async def test_an_acl_fenced_broker_works_in_its_own_namespace(acl_server):
    async with team_a(acl_server) as (agent, answering), answering.provider("ui") as provider:
        task = asyncio.create_task(agent.ask(one_question()))
        await (await next_pending(provider)).answer(pick("yes"), by="alice")
        assert await asyncio.wait_for(task, 10) == pick("yes")


async def test_remembered_decisions_work_under_the_namespace_acl(acl_server):
    """The documented per-namespace ACL allows setting, using, listing and revoking decisions."""
    async with team_a(acl_server) as (agent, answering):
        async with answering.provider("ui") as provider:
            task = asyncio.create_task(agent.ask(one_question()))
            await (await next_pending(provider)).answer(pick("yes"), by="alice", remember=Remember(scope="agent"))
            assert await asyncio.wait_for(task, 10) == pick("yes")
        assert await asyncio.wait_for(agent.ask(one_question()), 10) == pick("yes")  # decided, no provider
        [decision] = await answering.decisions()
        assert await answering.revoke_decision(decision.id, by="bob")


async def test_team_a_cannot_read_answer_or_disturb_team_b(acl_server):
    url_a, url_b = url_for(acl_server, "team-a", "pw-a"), url_for(acl_server, "team-b", "pw-b")
    async with (
        open_broker(url_b, "team-b") as asking_b,
        open_broker(url_b, "team-b") as answering_b,
        answering_b.provider("ui-b") as provider_b,
    ):
        task = asyncio.create_task(asking_b.ask(one_question()))
        pending = await next_pending(provider_b)
        keys_b = asking_b.keys

        # A broker of team A cannot even open on team B's namespace: a coded error at once,
        # with Redis's NOPERM refusal as its cause...
        with pytest.raises(UserQuestionError) as refused:
            async with asyncio.timeout(5), open_broker(url_a, "team-b"):
                pass
        assert refused.value.code == BROKER_UNAVAILABLE
        assert isinstance(refused.value.__cause__, NoPermissionError)

        # ...and team A's credentials reach none of team B's keys, by any command or script.
        intruder = redis_from_url(url_a)
        assert isinstance(intruder, Redis)
        try:
            request_key = keys_b.request(pending.request_id)
            reads = [
                intruder.xrange(keys_b.requests),
                intruder.hgetall(request_key),
                intruder.get(keys_b.provider),
                intruder.xrange(keys_b.audit),
                intruder.blpop([keys_b.inbox(asking_b.client_id)], timeout=0.1),  # type: ignore[arg-type]  # redis-py: int only; Redis takes 0.1
            ]
            writes = [
                intruder.delete(keys_b.provider),  # steal the lease
                intruder.set(keys_b.provider, "999:mine:thief"),
                intruder.xadd(keys_b.requests, {"kind": "ask", "rid": "x", "client": "y"}),  # poison
                intruder.hset(request_key, "state", "answered"),
                forged_settle(intruder, keys_b, pending.request_id, asking_b.client_id),
                intruder.execute_command("XGROUP", "DESTROY", keys_b.requests, "providers"),
            ]
            disturbances = [
                intruder.execute_command("KEYS", "*"),
                intruder.execute_command("SCAN", 0, "MATCH", "qb:{team-b}:*"),
                intruder.execute_command("SCRIPT", "FLUSH"),
                intruder.execute_command("FLUSHALL"),
                intruder.execute_command("CONFIG", "SET", "maxmemory", "1"),
                intruder.execute_command("CLIENT", "KILL", "TYPE", "normal"),
                intruder.execute_command("ACL", "SETUSER", "team-a", "~*"),
            ]
            allowed = []
            for i, attempt in enumerate((*reads, *writes, *disturbances)):
                try:
                    await attempt
                    allowed.append(i)
                except NoPermissionError:
                    pass
            assert allowed == []
        finally:
            await intruder.aclose()

        # Team B's request is untouched: still pending, and its own provider answers it.
        assert not provider_b.lost
        await pending.answer(pick("no"), by="bob")
        assert await asyncio.wait_for(task, 10) == pick("no")


# -- TLS ---------------------------------------------------------------------------------------


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificates(directory: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", "-new", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", "/CN=qb-test-ca", cwd=directory)  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=directory)  # fmt: skip
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "1", "-extfile", "san.ext", cwd=directory,
        )  # fmt: skip
    return directory


class TlsRedisServer(RedisServer):
    """A redis-server that listens only on a TLS port and requires client certificates."""

    def __init__(self, directory: Path, certs: Path) -> None:
        self.certs = certs
        port = free_port()
        super().__init__(
            directory,
            "--port", "0",
            "--tls-port", str(port),
            "--tls-cert-file", str(certs / "server.crt"),
            "--tls-key-file", str(certs / "server.key"),
            "--tls-ca-cert-file", str(certs / "ca.crt"),
            "--tls-auth-clients", "yes",
            port=port,
        )  # fmt: skip

    def _connect(self) -> socket.socket:
        context = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        context.load_cert_chain(str(self.certs / "client.crt"), str(self.certs / "client.key"))
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
        try:
            return context.wrap_socket(raw, server_hostname="127.0.0.1")
        except BaseException:
            raw.close()
            raise


@pytest.fixture
def tls_server(tmp_path: Path):
    certs = make_certificates(tmp_path / "certs")
    server = TlsRedisServer(tmp_path / "redis", certs).start()
    yield server
    server.kill()


def tls_url(server: TlsRedisServer, *, client_cert: bool = True, ca: Path | None = None) -> str:
    certs = server.certs
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={ca or certs / 'ca.crt'}"
    if client_cert:
        url += f"&ssl_certfile={certs / 'client.crt'}&ssl_keyfile={certs / 'client.key'}"
    return url


async def test_the_broker_works_over_tls(tls_server):
    url = tls_url(tls_server)
    async with (
        open_broker(url, "tls") as asking,
        open_broker(url, "tls") as answering,
        answering.provider("ui") as provider,
    ):
        task = asyncio.create_task(asking.ask(one_question()))
        await (await next_pending(provider)).answer(pick("yes"))
        assert await asyncio.wait_for(task, 10) == pick("yes")


@pytest.mark.parametrize("case", ["plaintext", "no-client-certificate", "unknown-ca"])
async def test_tls_refuses_what_it_should(tls_server, tmp_path, case):
    if case == "plaintext":
        url = f"redis://127.0.0.1:{tls_server.port}/0"
    elif case == "no-client-certificate":
        url = tls_url(tls_server, client_cert=False)
    else:
        other = make_certificates(tmp_path / "other")
        url = tls_url(tls_server, ca=other / "ca.crt")
    client = redis_from_url(url)
    assert isinstance(client, Redis)
    try:
        with pytest.raises((ConnectionError, OSError)):
            await asyncio.wait_for(client.ping(), 30)
    finally:
        await client.aclose()
