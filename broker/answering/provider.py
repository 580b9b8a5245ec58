"""The provider side: the namespace's lease holder, presenting the requests it delivers as cards.

A ``Provider`` is what ``Broker.provider()`` yields once it holds the lease (broker/answering/lease.py).
It is an async context manager that owns its background work: renewing the lease, reading the
request stream (broker/answering/delivery.py), reclaiming idle entries, sealing the audit, and sending the
settlements of its cards (broker/answering/settling.py). Iterate it for the cards (broker/answering/cards.py) to
present, in ``pending``'s order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import TracebackType

from redis.asyncio import Redis, RedisCluster

from .. import audit
from .._commands import Commands
from .._ids import UniqueIds
from .._keys import Keys
from .._scripts import Refusal, Reply
from .._tasks import Background
from ..errors import LEASE_LOST, UserQuestionError
from ..signing import SigningKey
from .cards import Asker, Cards, PendingRequest
from .delivery import Delivery
from .lease import HANDOVER_GRACE, Handover, Lease
from .provider_settings import ProviderSettings
from .settling import SealedSettlement, Settler

__all__ = ["HANDOVER_GRACE", "Asker", "Handover", "PendingRequest", "Provider", "ProviderSettings"]

log = logging.getLogger(__name__)


class Provider:
    """The namespace's active provider: iterate it for the requests to present.

    ``async with provider:`` runs its background work for the block (``Broker.provider()`` does it).
    """

    def __init__(
        self,
        *,
        keys: Keys,
        name: str,
        token: str,
        epoch: int,
        commands: Commands,
        blocking: Redis | RedisCluster,
        settings: ProviderSettings,
        signing_key: SigningKey,
        redis_ms: int = 0,
        coalesce: bool = True,
        last_checkpoint: str | None = None,
    ) -> None:
        self.keys = keys
        self.name = name
        self.epoch = epoch
        self.token = token
        self.commands = commands
        self.settings = settings
        self.consumer = f"{name}:{token[:12]}"
        self._signing_key = signing_key
        self._lease = Lease(
            commands=commands,
            keys=keys,
            settings=settings,
            name=name,
            token=token,
            epoch=epoch,
            on_change=self._wake,
        )
        self.fence = self._lease.fence
        self._settler = Settler(self._lease, signing_key=signing_key, redis_ms=redis_ms)
        self._cards = Cards(self._lease, self._settler, coalesce=coalesce)
        self._delivery = Delivery(self._lease, self._cards, blocking=blocking, consumer=self.consumer)
        self.checkpoint_every = audit.CHECKPOINT_EVERY
        """seconds between audit checkpoints while the audit moves"""
        self._checkpoint = last_checkpoint
        """the entry id of the audit checkpoint this process wrote last (a provider before this one of its broker
        passes it on): each checkpoint names it (``after``), so one that finds it gone tells of a lost audit"""
        self._background: Background | None = None

    def __repr__(self) -> str:
        return f"Provider(name={self.name!r}, namespace={self.keys.namespace!r}, epoch={self.epoch})"

    async def __aenter__(self) -> Provider:
        """Start the background work: the lease's renewal, the reads, the reclaims, the audit's seals, the settling."""
        background = self._background = Background()
        for work in (self.keep_lease, self.read, self.reclaim, self.seal_audit, self._settler.run):
            background.start(work, work.__qualname__)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        """Send the settlements on their way (for up to a lease TTL), then stop the background work."""
        background, self._background = self._background, None
        if background is None:
            return
        try:
            await self._settler.stop(within=self.settings.lease_ttl)
        finally:
            await background.aclose()

    def _wake(self) -> None:
        self._cards.wake.set()

    @property
    def coalesce(self) -> bool:
        """False: every request is its own card (``Broker.provider(..., coalesce=False)``)"""
        return self._cards.coalesce

    @property
    def settle_call_ids(self) -> UniqueIds:
        """one per settle.lua settlement, so that a retry after a lost reply recognises its own"""
        return self._settler.call_ids

    @property
    def handover(self) -> Handover | None:
        """Set once another provider asked for the lease: iterating ends (what was handed out may still be
        settled), and leaving the ``Broker.provider()`` block hands the lease to it"""
        return self._lease.handover

    def redis_ms(self) -> int:
        """Now by the Redis clock, unix ms, as read at start and carried on by the loop's monotonic clock."""
        return self._settler.redis_ms()

    @property
    def lost(self) -> bool:
        """True once the lease is gone: nothing more will be delivered or accepted."""
        return self._lease.lost

    async def wait_lost(self) -> None:
        await self._lease.wait_lost()

    async def wait_handover(self) -> Handover:
        """Return once another provider asked for the lease (``handover``)."""
        return await self._lease.wait_handover()

    def fenced(self) -> None:
        self._lease.fenced()

    @property
    def asker_count(self) -> int:
        """How many askers' requests the pending cards stand for (a coalesced card stands for several)."""
        return self._cards.asker_count

    def track_changes(self) -> None:
        """From now on, note every card withdrawn or changed, for ``changes()``.

        For a UI that shows every pending card at once (a web page): one waiter for them all, rather
        than a task per card waiting on its ``withdrawn`` and ``changed`` (with 100 000 pending those
        tasks were about 5 KB a card)."""
        self._cards.track_changes()

    async def changes(self) -> list[PendingRequest]:
        """Wait for, and return, the cards withdrawn or changed since the last call (``track_changes()``
        first), each once, in the order they first changed. Their ``withdrawn`` and ``changed`` say what
        happened (``changed`` is left set: a UI that waits on it clears it)."""
        return await self._cards.changes()

    def forget(self, request_id: str) -> None:
        """An asker's request is settled or gone here; its card goes with the last of them."""
        self._cards.forget(request_id)

    @property
    def pending(self) -> list[PendingRequest]:
        """Requests delivered here and not yet settled or withdrawn, in presentation order.

        Urgent first, then normal, then low; within a level, round-robin across asking agents,
        each agent's oldest first (identical requests of several askers are one card). Orders
        every card: a view of the next few uses ``first(n)`` and ``pending_count``.
        """
        return self._cards.pending

    def first(self, n: int) -> list[PendingRequest]:
        """The first ``n`` of ``pending``, in its order, in O(n log n + log N) for N pending."""
        return self._cards.first(n)

    @property
    def pending_count(self) -> int:
        """How many requests ``pending`` lists, in O(1)."""
        return self._cards.pending_count

    def __aiter__(self) -> AsyncIterator[PendingRequest]:
        return self

    async def __anext__(self) -> PendingRequest:
        """The next card to present, in the order ``pending`` describes."""
        cards = self._cards
        while True:
            if self._lease.lost:
                raise UserQuestionError("this provider no longer holds the lease", LEASE_LOST)
            if self._lease.handover is not None:
                raise StopAsyncIteration
            card = cards.hand_out()
            if card is not None:
                return card
            cards.wake.clear()
            await cards.wake.wait()

    def take_ready(self, most: int) -> list[PendingRequest]:
        """Up to ``most`` more cards that are ready now, in ``__anext__``'s order, without waiting: after one
        ``anext``, a UI that shows many at once takes a failover's backlog in batches (the next ones ``anext``
        would return; none if the lease is lost or another provider asked for it)."""
        cards: list[PendingRequest] = []
        while len(cards) < most and not self._lease.lost and self._lease.handover is None:
            card = self._cards.hand_out()
            if card is None:
                break
            cards.append(card)
        return cards

    async def settle_all(self, settlements: list[SealedSettlement]) -> list[Reply | Refusal]:
        """Settlements (a coalesced card's askers) through settle.lua, a reply for each.

        Those queued meanwhile go in the same call, sealed together under one signature.
        """
        return await self._settler.settle_all(settlements)

    # -- background work, run while the provider is entered ------------------------------

    async def keep_lease(self) -> None:
        """Renew the lease every third of its TTL; fence ourselves once Redis says it is gone."""
        await self._lease.keep()

    async def read(self) -> None:
        """Deliver the stream's requests into the local queue until the lease is lost."""
        await self._delivery.read()

    async def reclaim(self) -> None:
        """Every ``reclaim_every`` seconds, claim entries idle in any pending list and present them."""
        await self._delivery.reclaim()

    async def seal_audit(self) -> None:
        """Checkpoint the audit at once, then every ``checkpoint_every`` seconds while it moves.

        Each checkpoint signs the chain head (docs/security.md, "a tamper-evident audit"): one
        signature per period however busy the namespace, none while it is idle. Until the next
        one, the entries after the last checkpoint are chained but not signed.
        """
        while not self._lease.lost:
            await self.checkpoint()
            await asyncio.sleep(self.checkpoint_every)

    async def checkpoint(self) -> None:
        """One audit checkpoint, unless nothing moved since this provider's last; a failure is only logged."""
        try:
            self._checkpoint = (
                await audit.checkpoint(
                    self.commands,
                    self.keys,
                    self._signing_key,
                    provider=self.name,
                    epoch=self.epoch,
                    maxlen=self.settings.audit_maxlen,
                    unless_at=self._checkpoint,
                    after=self._checkpoint,
                )
                or self._checkpoint
            )
        except Exception as error:
            log.warning("audit checkpoint failed: %r (the next one seals what this one would have)", error)

    @property
    def last_checkpoint(self) -> str | None:
        """The entry id of the audit checkpoint this process wrote last, for the next provider of its broker."""
        return self._checkpoint
