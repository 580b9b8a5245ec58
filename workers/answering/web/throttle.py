"""Who is knocking, and how often: the client address behind trusted proxies, and failure throttles.

Failed sign-ins are counted per user name and per client address, in Redis (so every
server of the namespace sees the same counts, and a restart forgives nothing), and so
are guessed bearer tokens (per address). Past a limit the answer is 429 with
``Retry-After``, before any password is checked.

The client address is the peer's, unless the peer is a trusted proxy: then it is the
right-most ``X-Forwarded-For`` entry that is not itself a trusted proxy. Without
``--trusted-proxy`` the header is ignored (anyone can write it).
"""

from __future__ import annotations

import ipaddress
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.requests import Request

from workers.answering.web.errors import WebError
from workers.answering.web.keys import WebKeys

__all__ = ["Network", "Throttle", "ThrottleLimits", "client_address", "parse_networks"]

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Call = Callable[..., Awaitable[Any]]
_SCRIPT = (Path(__file__).parent / "throttle.lua").read_text()


def parse_networks(specs: Iterable[str]) -> tuple[Network, ...]:
    """``10.0.0.1``, ``10.0.0.0/8`` or ``::1`` to networks; ``ValueError`` names a bad one."""
    networks = []
    for spec in specs:
        try:
            networks.append(ipaddress.ip_network(spec.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--trusted-proxy {spec!r} is not an IP address or network") from None
    return tuple(networks)


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in proxies)


def client_address(request: Request, proxies: tuple[Network, ...]) -> str:
    peer = request.client.host if request.client else ""
    if not proxies or not _trusted(peer, proxies):
        return peer
    hops = [hop.strip() for hop in ",".join(request.headers.getlist("x-forwarded-for")).split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, proxies):
            return hop[:100]
    return hops[0][:100] if hops else peer


@dataclass(frozen=True, kw_only=True)
class ThrottleLimits:
    per_user: int = 10
    """failed sign-ins per user name in a window"""
    per_address: int = 30
    """failed sign-ins and token guesses per client address in a window"""
    window_s: float = 300.0


class Throttle:
    def __init__(self, call: Call, keys: WebKeys, limits: ThrottleLimits) -> None:
        self._call, self._keys, self.limits = call, keys, limits

    async def take_sign_in(self, user: str | None, address: str) -> None:
        """Count a sign-in attempt before checking it, or refuse with 429."""
        await self._run("take", self._sign_in_keys(user, address))

    async def give_back_sign_in(self, user: str | None, address: str) -> None:
        """The attempt succeeded: it does not count."""
        await self._run("give", self._sign_in_keys(user, address))

    async def check_token(self, address: str) -> None:
        await self._run("check", [(self._keys.throttle("addr", address), self.limits.per_address)])

    async def token_failed(self, address: str) -> None:
        await self._run("fail", [(self._keys.throttle("addr", address), self.limits.per_address)])

    def _sign_in_keys(self, user: str | None, address: str) -> list[tuple[str, int]]:
        keys = [(self._keys.throttle("addr", address), self.limits.per_address)]
        if user is not None:
            keys.append((self._keys.throttle("user", user), self.limits.per_user))
        return keys

    async def _run(self, mode: str, keys: list[tuple[str, int]]) -> None:
        window_ms = int(self.limits.window_s * 1000)
        try:
            wait_ms = await self._call(
                "EVAL", _SCRIPT, len(keys), *(key for key, _ in keys), mode, window_ms, *(limit for _, limit in keys)
            )
        except (RedisConnectionError, RedisTimeoutError, OSError) as error:
            # Without Redis there are no sessions to make and nothing to answer; a bearer
            # request may still read the page's status, its token compared as always.
            log.warning("sign-in throttle unavailable (%s): %s", mode, error)
            return
        if int(wait_ms) > 0:
            retry_after = max(1, math.ceil(int(wait_ms) / 1000))
            raise WebError(
                429,
                "TOO_MANY_ATTEMPTS",
                f"too many failed attempts; try again in {retry_after} s",
                headers={"Retry-After": str(retry_after)},
            )
