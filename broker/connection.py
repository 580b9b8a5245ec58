"""Redis clients from a URL: a single server, TLS, a Redis Cluster, or a Sentinel-managed master.

URL forms (credentials are URL-encoded; every form takes the query parameters below)::

    redis://[user:pass@]host:port[/db]
    rediss://[user:pass@]host:port[/db]?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem
    redis+cluster://[user:pass@]host:port[,host:port...]          (rediss+cluster:// for TLS)
    redis+sentinel://[user:pass@]host:port[,host:port...]/service_name[/db]   (rediss+sentinel://)

Query parameters: ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``
(``none`` | ``optional`` | ``required``), ``ssl_check_hostname`` (``true``/``false``),
``socket_timeout`` (seconds), and for Sentinel ``sentinel_username`` / ``sentinel_password``
(the sentinels' own credentials; the ones in the URL are the master's).

This module is the one place where the broker's Redis clients are built, for every scheme,
with the same timeouts and retry policy (docs/architecture.md, "The client's rules"):

- a *command* client (``blocking=False``) has a socket timeout, so a silent server fails a
  command instead of hanging it, and redis-py reconnects and re-sends a few times (every
  command the broker sends is safe to repeat); ``broker._commands`` adds the overall deadline;
- a *blocking* client (``blocking=True``: BLMPOP, XREADGROUP, BLPOP) has neither: redis-py
  never re-sends a blocking read whose reply was lost with its connection, so its caller sees
  the break and recovers from durable state, and the caller bounds each read with an event-loop
  deadline (a socket timeout on a blocking connection has swallowed a cancelled XREADGROUP).

A Sentinel client resolves the master on each new connection, so after a failover it follows
the promoted replica; a Cluster client follows MOVED replies and re-reads the slot map.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import hiredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
from redis._parsers.hiredis import _AsyncHiredisParser
from redis.asyncio import Connection, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from .errors import BAD_REQUEST, UserQuestionError

__all__ = ["COMMAND_TIMEOUT", "SCHEMES", "SentinelManagedRedis", "redis_from_url"]

SCHEMES = ("redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
_TLS_PARAMS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
_PARAMS = frozenset((*_TLS_PARAMS, "socket_timeout", "sentinel_username", "sentinel_password"))
_CERT_REQS = ("none", "optional", "required")
_RETRIES = 3
COMMAND_TIMEOUT = 10.0
"""seconds a command client waits for one reply before it counts the connection as broken"""


@dataclass(frozen=True)
class _Url:
    scheme: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None = field(repr=False)
    path: tuple[str, ...]
    params: Mapping[str, str]

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")


def redis_from_url(url: str, *, name: str | None = None, blocking: bool = False) -> Redis | RedisCluster:
    """The redis-py asyncio client for ``url`` (see the module docstring for the forms).

    ``name`` becomes the connections' CLIENT SETNAME; ``blocking`` builds a client for blocking
    reads (no socket timeout, no silent re-send). An unknown scheme, a malformed host list or an
    unknown or empty query parameter is ``BAD_REQUEST`` (the URL itself is never echoed, since it
    may carry a password).
    """
    parsed = _parse(url)
    options = _options(parsed, name, blocking)
    if parsed.scheme in ("redis+cluster", "rediss+cluster"):
        if parsed.path:
            raise UserQuestionError("a cluster URL takes no path (a cluster has only database 0)", BAD_REQUEST)
        cluster: RedisCluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in parsed.hosts],
            username=parsed.username,
            password=parsed.password,
            # The cluster client re-sends a command after a connection error on its own;
            # a blocking read must not be re-sent (its reply may have been lost).
            cluster_error_retry_attempts=0 if blocking else 3,
            **options,
        )
        return cluster
    client: Redis
    if parsed.scheme in ("redis+sentinel", "rediss+sentinel"):
        client = _sentinel_master(parsed, options)
    elif len(parsed.hosts) != 1:
        raise UserQuestionError("a redis:// URL names one host; use redis+cluster:// or redis+sentinel://", BAD_REQUEST)
    else:
        (host, port), db = parsed.hosts[0], _db(parsed.path, 0)
        client = Redis(host=host, port=port, db=db, username=parsed.username, password=parsed.password, **options)
        if not parsed.tls:  # TLS keeps its own connection class
            client.connection_pool.connection_class = _HiredisPackingConnection
    if blocking:
        # One reader per blocking client, on the connection it keeps. A pooled connection is polled
        # before every command under a zero timeout, and a cancellation that lands in that poll is
        # taken for the timeout and lost (redis-py 5): a provider's read cancelled there read on.
        client.single_connection_client = True
    return client


class _HiredisPackingConnection(Connection):
    """redis-py's asyncio connection packs commands in Python; hiredis does it in C.

    Packing was the largest single cost of a busy provider in the benchmark's profile.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        return [hiredis.pack_command(args)]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """A command the socket takes at once is written without redis-py's write timer.

        With a socket timeout redis-py sends every command inside ``asyncio.wait_for``, a task per
        command: on a command client that was two tasks an ask, a tenth of a millisecond each. The
        timer only matters for a write that has to wait (the transport's buffer full, its writing
        paused); that one still gets it (``super()``).
        """
        writer = self._writer
        if (
            check_health
            or writer is None
            or writer.transport.is_closing()
            or writer.transport.get_write_buffer_size()
            or not isinstance(command, list)
        ):
            return await super().send_packed_command(command, check_health)
        writer.writelines(command)
        if writer.transport.get_write_buffer_size():  # the socket did not take it all: wait, under the timer
            await super().send_packed_command([], check_health=False)

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        """A reply already buffered (the rest of a pipeline's replies, mostly) is taken at once.

        redis-py arms a socket-timeout timer for every reply it reads, even one that is already
        in the buffer; that was the asker's largest cost after the socket writes. Only a read
        that has to wait on the socket needs the timer, and it still gets it (``super()``).
        """
        parser = self._parser
        reader = None
        if isinstance(parser, _AsyncHiredisParser) and getattr(parser, "_connected", False):
            reader = parser._reader
        if reader is not None and not disable_decoding:
            try:
                response = reader.gets()
            except BaseException:
                if disconnect_on_error:
                    await self.disconnect(nowait=True)
                raise
            if response is not _NOT_ENOUGH_DATA:
                failed = response if isinstance(response, ConnectionError) else None
                if isinstance(response, list) and response and isinstance(response[0], ConnectionError):
                    failed = response[0]
                if failed is not None:
                    if disconnect_on_error:
                        await self.disconnect(nowait=True)
                    raise failed
                if self.health_check_interval:
                    self.next_health_check = asyncio.get_running_loop().time() + self.health_check_interval
                if isinstance(response, ResponseError):
                    raise response from None
                return response
        return await super().read_response(
            disable_decoding, timeout, disconnect_on_error=disconnect_on_error, push_request=push_request
        )


class SentinelManagedRedis(Redis):
    """A client of the master a Sentinel group names; closing it closes the sentinel clients too."""

    sentinel_group: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinel_group is not None:
            for client in self.sentinel_group.sentinels:
                await client.aclose()


def _sentinel_master(parsed: _Url, options: dict[str, Any]) -> SentinelManagedRedis:
    if not parsed.path or not parsed.path[0]:
        raise UserQuestionError("a sentinel URL names the master's service: redis+sentinel://h:p/service", BAD_REQUEST)
    service, db = parsed.path[0], _db(parsed.path[1:], 0)
    sentinel_options: dict[str, Any] = {
        "username": parsed.params.get("sentinel_username"),
        "password": parsed.params.get("sentinel_password"),
        "decode_responses": True,
        "socket_connect_timeout": options["socket_connect_timeout"],
        # Asking a sentinel for the master is a plain command, even for a blocking client.
        "socket_timeout": options["socket_timeout"] or COMMAND_TIMEOUT,
        "retry": _command_retry(),
        "retry_on_error": [ConnectionError, TimeoutError],
    }
    if parsed.tls:
        sentinel_options.update({k: v for k, v in options.items() if k.startswith("ssl")})
    sentinel = Sentinel(list(parsed.hosts), sentinel_kwargs=sentinel_options)  # type: ignore[no-untyped-call]
    client: SentinelManagedRedis = sentinel.master_for(
        service,
        redis_class=SentinelManagedRedis,
        db=db,
        username=parsed.username,
        password=parsed.password,
        **options,
    )
    client.sentinel_group = sentinel
    return client


def _command_retry() -> Retry:
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=_RETRIES)


def _options(parsed: _Url, name: str | None, blocking: bool) -> dict[str, Any]:
    params = parsed.params
    blank = sorted(key for key, value in params.items() if not value.strip())
    if blank:
        raise UserQuestionError(f"Redis URL parameters {blank} are empty", BAD_REQUEST)
    options: dict[str, Any] = {
        "client_name": name,
        "decode_responses": True,
        "socket_connect_timeout": 5.0,
        "socket_keepalive": True,
    }
    if blocking:
        options.update(retry=Retry(NoBackoff(), 0), retry_on_error=[], socket_timeout=None)
    else:
        options.update(
            retry=_command_retry(),
            retry_on_error=[ConnectionError, TimeoutError],
            socket_timeout=_float(params, "socket_timeout") if "socket_timeout" in params else COMMAND_TIMEOUT,
        )
    tls = {k: params[k] for k in _TLS_PARAMS if k in params}
    if tls and not parsed.tls:
        raise UserQuestionError(f"TLS parameters {sorted(tls)} need a rediss:// scheme", BAD_REQUEST)
    if parsed.tls:
        options["ssl"] = True
        for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if key in tls:
                options[key] = tls[key]
        reqs = tls.get("ssl_cert_reqs", "required")
        if reqs not in _CERT_REQS:
            raise UserQuestionError(f"ssl_cert_reqs must be one of {_CERT_REQS}", BAD_REQUEST)
        options["ssl_cert_reqs"] = reqs
        options["ssl_check_hostname"] = tls.get("ssl_check_hostname", "false").lower() in ("1", "true", "yes")
    return options


def _parse(url: str) -> _Url:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise UserQuestionError(
            f"unknown Redis URL scheme {scheme.lower() if sep else ''!r}; expected one of {', '.join(SCHEMES)}",
            BAD_REQUEST,
        )
    rest, _, query = rest.partition("?")
    rest, _, _fragment = rest.partition("#")
    location, _, path = rest.partition("/")
    userinfo, at, hostlist = location.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
        if not colon:  # redis://secret@host is the classic password-only form
            username, password = None, unquote(user) or None
    params = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(params) - _PARAMS)
    if unknown:
        raise UserQuestionError(f"unknown Redis URL parameters {unknown}; known: {sorted(_PARAMS)}", BAD_REQUEST)
    parts = hostlist.split(",")
    if len(parts) > 1 and not all(parts):
        raise UserQuestionError("an empty host in a Redis URL's host list", BAD_REQUEST)
    return _Url(
        scheme=scheme.lower(),
        hosts=tuple(_host(part) for part in parts),
        username=username,
        password=password,
        path=tuple(unquote(p) for p in path.split("/") if p),
        params=params,
    )


def _host(part: str) -> tuple[str, int]:
    if part.startswith("["):  # [IPv6]:port
        host, _, port = part[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = part.partition(":")
    host = host or "localhost"
    if not port:
        return host, 6379
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UserQuestionError(f"bad port {port!r} in a Redis URL", BAD_REQUEST)
    return host, int(port)


def _db(path: tuple[str, ...], default: int) -> int:
    if not path:
        return default
    if len(path) > 1 or not path[0].isdigit():
        raise UserQuestionError(f"bad database {'/'.join(path)!r} in a Redis URL", BAD_REQUEST)
    return int(path[0])


def _float(params: Mapping[str, str], key: str) -> float:
    try:
        return float(params[key])
    except ValueError:
        raise UserQuestionError(f"{key} must be a number of seconds", BAD_REQUEST) from None
