"""The namespace's provider lease: one holder, fenced by an epoch and a token, with standbys.

A holder renews its lease in the background; standbys block until it is released or lapses.
Every action a provider takes on a request is a script that first checks the lease (its
``fence``), so a provider that stalled past its lease (GC, SIGSTOP, partition) cannot answer
when it wakes up. Another provider may ask for the lease (a handover): the holder learns it at
its next renewal.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from redis.asyncio import Redis, RedisCluster

from .._commands import Commands
from .._keys import GROUP, Keys
from .._scripts import lease_acquire, lease_release, lease_renew, lease_renew_first
from ..backoff import Backoff
from ..errors import DUPLICATE_PROVIDER, UserQuestionError
from .provider_settings import ProviderSettings

__all__ = [
    "HANDOVER_GRACE",
    "REPLY_MARGIN_S",
    "Handover",
    "Lease",
    "LeaseHolder",
    "acquire_lease",
    "release_lease",
    "replicated",
]

log = logging.getLogger(__name__)

REPLY_MARGIN_S = 3.0
"""how long past its block a blocking read's reply may be late before the connection counts as silent"""
HANDOVER_GRACE = 15.0
"""seconds a holder with a question open gives its person to finish it once a handover is asked, by default
(``Broker.request_handover``); then it hands over anyway, the question still pending"""


class Handover(NamedTuple):
    """Another provider asked for the lease (``Broker.request_handover``)."""

    to: str
    """the provider's name: the lease is kept for it once this holder lets go"""
    by: str
    """who asked (a person signed in to a page, say)"""
    grace: float = HANDOVER_GRACE
    """seconds a question open here may take to finish before this holder hands over anyway, leaving it pending"""


class LeaseHolder(Protocol):
    """What names a holder's lease: its fence, and the token and name it registered with."""

    @property
    def fence(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def name(self) -> str: ...


def _lease_keys(keys: Keys) -> dict[str, str]:
    """The keys every lease script takes besides its own: the lease, its standbys, its record."""
    return {"lease": keys.provider, "standbys": keys.standbys, "record": keys.lease_record}


@dataclass(kw_only=True, eq=False, repr=False)
class Lease:
    """A held lease: renewed in the background (``keep``) until Redis says it is gone."""

    commands: Commands
    keys: Keys
    settings: ProviderSettings
    name: str
    token: str
    epoch: int
    on_change: Callable[[], None]
    """told when the lease is lost or a handover asked: whoever waits for the next card looks again"""
    handover: Handover | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.fence = f"{self.epoch}:{self.token}:"
        self.on_stream = {
            "lease": self.keys.provider,
            "requests": self.keys.requests,
            "fence": self.fence,
            "group": GROUP,
        }
        """what every fenced script on the request stream takes first: the lease, the stream, the fence, the group"""
        self._lost = asyncio.Event()
        self._handover_asked = asyncio.Event()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    async def wait_lost(self) -> None:
        await self._lost.wait()

    async def wait_handover(self) -> Handover:
        await self._handover_asked.wait()
        assert self.handover is not None
        return self.handover

    def fenced(self) -> None:
        if not self._lost.is_set():
            log.warning("provider %s lost the lease of %s (epoch %s)", self.name, self.keys.namespace, self.epoch)
            self._lost.set()
            self.on_change()

    async def keep(self) -> None:
        """Renew the lease every third of its TTL; fence ourselves once Redis says it is gone.

        Not before: while Redis cannot be reached nobody can take the lease, and a lease that lapsed while Redis
        restarted is still ours (scripts/_kept.lua). After a failure the renewal is sent first, before anything
        queued meanwhile (``Commands.lead_after_outage``): a fenced script must not find the lease missing
        before the renewal takes it back. A provider cut off from a Redis that others reach learns that it lost
        the lease when it reaches Redis again; until then Redis refuses whatever it sends there.
        """
        ttl = self.settings.lease_ttl
        lease = {**_lease_keys(self.keys), "fence": self.fence}
        ttl_ms, member = int(ttl * 1000), f"{self.token}:{self.name}"
        stop_leading = lease_renew_first(self.commands, **lease, ttl=ttl_ms, member=member, renewed=self._renewed)
        try:
            while not self._lost.is_set():
                await asyncio.sleep(ttl / 3)
                try:
                    renewed = await lease_renew(self.commands, **lease, ttl=ttl_ms, member=member)
                except Exception as error:
                    log.warning("lease renewal failed: %r", error)
                    continue
                self._renewed(renewed)
                if renewed:
                    await self._check_handover()
        finally:
            stop_leading()

    def _renewed(self, renewed: bool) -> None:
        if not renewed:
            self.fenced()

    async def _check_handover(self) -> None:
        """Whether another provider asked for the lease; a failure to read it is only a later notice."""
        if self.handover is not None:
            return
        try:
            reserved = await self.commands.call("GET", self.keys.handover)
        except Exception as error:
            log.debug("could not read the handover reservation: %r", error)
            return
        to, _, rest = str(reserved or "").partition("\n")
        by, _, grace_ms = rest.partition("\n")
        if reserved and to != self.name:
            log.info("provider %s: %s asks that %s take the lease of %s", self.name, by, to, self.keys.namespace)
            grace = int(grace_ms) / 1000 if grace_ms.isdigit() else HANDOVER_GRACE
            self.handover = Handover(to, by, grace)
            self._handover_asked.set()
            self.on_change()


async def acquire_lease(
    *,
    commands: Commands,
    blocking: Redis | RedisCluster,
    keys: Keys,
    name: str,
    settings: ProviderSettings,
    standby: bool,
    on_standby: Callable[[str], Any] | None = None,
) -> tuple[str, int]:
    """Take the lease, waiting as a registered standby when ``standby``; returns (token, epoch).

    With ``settings.min_replicas``, the lease counts as taken only once that many replicas
    have it (WAIT): a failover right after cannot hand the namespace to a second holder.
    """
    token = secrets.token_hex(16)
    ttl_ms = int(settings.lease_ttl * 1000)
    announced = False
    member = f"{token}:{name}"
    backoff = Backoff(first=0.05, cap=2.0)
    try:
        while True:
            lease = await lease_acquire(
                commands,
                **_lease_keys(keys),
                epoch=keys.epoch,
                handover=keys.handover,
                token=token,
                name=name,
                ttl=ttl_ms,
                standby_ttl=ttl_ms * 3 if standby else 0,
            )
            epoch, remaining_ms = lease.epoch, lease.remaining_ms
            if epoch:
                if await replicated(commands, settings, f"the lease of {keys.namespace}"):
                    return token, epoch
                await asyncio.sleep(backoff.next())
                continue
            holder = _holder_name(lease.holder)
            if not standby:
                raise UserQuestionError(
                    f"provider {holder!r} is already active in namespace {keys.namespace!r}", DUPLICATE_PROVIDER
                )
            if not announced:
                log.info("standing by: %s holds the lease of %s", holder, keys.namespace)
                if on_standby is not None:
                    on_standby(holder)
                announced = True
            # Wake at once on a clean release, else when the holder's lease would lapse,
            # and at least every lease TTL to refresh our standby registration.
            wait_s = max(0.01, min(remaining_ms, ttl_ms) / 1000 + 0.005)
            try:
                async with asyncio.timeout(wait_s + REPLY_MARGIN_S):
                    await blocking.execute_command("BLPOP", keys.lease_signal, wait_s)
                backoff.reset()
            except Exception as error:
                delay = backoff.next()
                log.warning("standby wait interrupted (%r); trying again in %.2fs", error, delay)
                await asyncio.sleep(delay)
    except BaseException:
        try:
            await commands.call("ZREM", keys.standbys, member)
        except Exception as error:
            log.info("could not leave the standbys: %r (the registration expires)", error)
        raise


async def replicated(commands: Commands, settings: ProviderSettings, what: str) -> bool:
    """True once ``settings.min_replicas`` replicas have every write sent so far (at once when 0)."""
    if settings.min_replicas <= 0:
        return True
    acked = int(await commands.call("WAIT", settings.min_replicas, int(settings.replica_timeout * 1000)))
    if acked < settings.min_replicas:
        log.warning(
            "%s reached %d of %d replicas in %.1fs", what, acked, settings.min_replicas, settings.replica_timeout
        )
        return False
    return True


async def release_lease(commands: Commands, keys: Keys, holder: LeaseHolder) -> None:
    await lease_release(
        commands,
        **_lease_keys(keys),
        signal=keys.lease_signal,
        fence=holder.fence,
        member=f"{holder.token}:{holder.name}",
    )


def _holder_name(value: str) -> str:
    parts = value.split(":", 2)
    return parts[2] if len(parts) == 3 else value
