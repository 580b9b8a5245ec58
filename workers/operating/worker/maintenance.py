"""The maintenance worker: arq cron jobs for housekeeping, and webhook notifications with retries.

Several workers may run at once, on one arq queue or on several: every scheduled run is
claimed in the broker's Redis (:func:`broker.operating.housekeeping.claim_run`, keyed by the slot of
the Redis clock), so one worker does each run once; and every step is idempotent anyway.
arq's queue may live on its own Redis (``arq_redis_url``): arq cannot run on Redis Cluster.
Jobs are serialised with msgspec (MessagePack), never pickle.
"""

from __future__ import annotations

import logging
import os
import socket
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import msgspec
from arq import Retry, Worker, cron
from arq.connections import RedisSettings
from arq.cron import CronJob
from arq.worker import func

from broker import Broker
from broker.operating.housekeeping import (
    PendingInfo,
    claim_run,
    digest_audit,
    lease_holder,
    mark_notified,
    mark_worker_alive,
    pending_requests,
    record_run,
    redis_time_ms,
    run_housekeeping,
    unmark_notified,
)
from workers.metrics import ASKS, DEAD_LETTERS, HOUSEKEEPING, NOTIFICATIONS, PENDING, REJECTED, TIME_TO_ANSWER
from workers.operating.worker.webhooks import NoticeKind, WebhookFormat, payload, post

__all__ = [
    "MaintenanceConfig",
    "build_worker",
    "deliver_webhook",
    "deserialize",
    "housekeeping",
    "notify",
    "serialize",
    "worker_settings",
]

log = logging.getLogger(__name__)

_Target = Literal["notify", "escalate"]

ALIVE_INTERVALS = 3
"""the worker presence marker outlives a run by this many intervals: a late cron run is no absence"""


@dataclass(frozen=True, kw_only=True)
class MaintenanceConfig:
    """Everything the maintenance worker needs; built once at the process edge."""

    redis_url: str = field(repr=False)
    namespace: str = "default"
    arq_redis_url: str | None = field(default=None, repr=False)
    """arq's queue, when not on the broker's Redis (required with a Redis Cluster)"""
    queue_name: str = "qbroker:maintenance"
    interval: int = 10
    """seconds between housekeeping (and notification) runs; divides 60, or a multiple of 60 dividing 3600"""
    audit_maxlen: int = 10_000
    webhook_urls: tuple[str, ...] = field(default=(), repr=False)
    escalation_url: str | None = field(default=None, repr=False)
    webhook_secret: str = field(default="", repr=False)
    webhook_format: WebhookFormat = "json"
    notify_after: float = 300.0
    """seconds a request waits before the webhooks are told"""
    unattended_after: float = 30.0
    """seconds a request waits while no provider holds the lease before the webhooks are told"""
    escalate_after: float | None = None
    """seconds a request waits before the escalation URL is told"""
    attempts: int = 5
    backoff: float = 1.0
    backoff_max: float = 300.0
    http_timeout: float = 10.0
    poll_delay: float = 0.5
    worker_name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    def __post_init__(self) -> None:
        if self.interval <= 0 or (60 % self.interval and (self.interval % 60 or 3600 % self.interval)):
            raise ValueError(f"interval {self.interval}s must divide 60, or be a multiple of 60 that divides 3600")
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.escalate_after is not None and self.escalation_url is None:
            raise ValueError("an escalation threshold needs an escalation URL")


@dataclass(frozen=True, kw_only=True)
class _State:
    config: MaintenanceConfig
    broker: Broker
    session: aiohttp.ClientSession
    stack: AsyncExitStack


# -- serialisation: msgspec MessagePack, never pickle ------------------------------------


def _fallback(value: Any) -> Any:
    return repr(value)  # a failed job's exception, kept readable in its result


_encoder = msgspec.msgpack.Encoder(enc_hook=_fallback)
_decoder = msgspec.msgpack.Decoder(dict[str, Any])


def serialize(data: dict[str, Any]) -> bytes:
    return _encoder.encode(data)


def deserialize(raw: bytes) -> dict[str, Any]:
    return _decoder.decode(raw)


# -- lifecycle ------------------------------------------------------------------------------


async def _startup(ctx: dict[str, Any]) -> None:
    config: MaintenanceConfig = ctx["config"]
    stack = AsyncExitStack()
    await stack.__aenter__()
    try:
        broker = await stack.enter_async_context(
            Broker(config.redis_url, config.namespace, audit_maxlen=config.audit_maxlen)
        )
        session = await stack.enter_async_context(aiohttp.ClientSession())
    except BaseException:
        await stack.aclose()
        raise
    ctx["qb"] = _State(config=config, broker=broker, session=session, stack=stack)
    log.info("maintenance worker %s serving namespace %s", config.worker_name, config.namespace)


async def _shutdown(ctx: dict[str, Any]) -> None:
    state: _State | None = ctx.pop("qb", None)
    if state is not None:
        await state.stack.aclose()


async def _claim(state: _State, job: str) -> str | None:
    """This run's slot when this worker claimed it, else None."""
    interval = state.config.interval
    slot = str(await redis_time_ms(state.broker) // (interval * 1000))
    if await claim_run(state.broker, job, slot, worker=state.config.worker_name, ttl=interval * 2):
        return slot
    log.debug("%s run %s of %s is another worker's", job, slot, state.config.namespace)
    return None


# -- cron jobs ------------------------------------------------------------------------------


async def housekeeping(ctx: dict[str, Any]) -> dict[str, str] | None:
    """Reap requests of gone askers, expire past deadlines, cap the audit, prune standbys."""
    state: _State = ctx["qb"]
    # Every worker, claimant or not: while one is alive, the lease holder leaves housekeeping to the workers.
    await mark_worker_alive(state.broker, state.config.worker_name, ttl=state.config.interval * ALIVE_INTERVALS)
    slot = await _claim(state, "housekeeping")
    if slot is None:
        return None
    ns = state.config.namespace
    report = await run_housekeeping(state.broker, audit_maxlen=state.config.audit_maxlen, every=state.config.interval)
    fields = report.as_fields()
    HOUSEKEEPING.labels(ns, "runs").inc()
    HOUSEKEEPING.labels(ns, "withdrawn").inc(len(report.withdrawn))
    HOUSEKEEPING.labels(ns, "expired").inc(len(report.expired))
    HOUSEKEEPING.labels(ns, "stale").inc(report.stale_entries)
    HOUSEKEEPING.labels(ns, "trimmed").inc(report.audit_trimmed)
    HOUSEKEEPING.labels(ns, "standbys").inc(report.standbys_dropped)
    DEAD_LETTERS.labels(ns).set(report.dead_letters)
    PENDING.labels(ns).set(report.pending)
    ended = await digest_audit(state.broker)  # None: another worker counted this stretch
    for settled in ended or ():
        if settled.outcome == "rejected":
            REJECTED.labels(ns).inc()
            continue
        ASKS.labels(ns, settled.outcome).inc()
        if settled.seconds is not None and settled.outcome in ("answered", "cancelled"):
            TIME_TO_ANSWER.labels(ns).observe(settled.seconds)
    fields["ended"] = str(len(ended or ()))
    await record_run(state.broker, "housekeeping", slot, worker=state.config.worker_name, fields=fields)
    did_something = report.withdrawn or report.expired or report.stale_entries or report.standbys_dropped
    log.log(
        logging.INFO if did_something else logging.DEBUG,
        "housekeeping of %s, run %s: %s",
        ns,
        slot,
        " ".join(f"{k}={v}" for k, v in fields.items()),
    )
    return fields


async def notify(ctx: dict[str, Any]) -> int | None:
    """Queue one notification per request and level for requests waiting past a threshold."""
    state: _State = ctx["qb"]
    config = state.config
    if not config.webhook_urls and config.escalation_url is None:
        return 0
    slot = await _claim(state, "notify")
    if slot is None:
        return None
    broker = state.broker
    pending = await pending_requests(broker)
    holder = await lease_holder(broker)
    now_ms = await redis_time_ms(broker)
    PENDING.labels(config.namespace).set(len(pending))
    queued = 0
    for info in pending:
        waited = (now_ms - info.created_ms) / 1000
        kind: NoticeKind | None = None
        if holder is None and waited >= config.unattended_after:
            kind = "unattended"
        elif waited >= config.notify_after:
            kind = "waiting"
        if kind is not None and config.webhook_urls:
            queued += await _notify_once(ctx, state, info, kind, "notify", now_ms=now_ms, provider=holder)
        if config.escalate_after is not None and waited >= config.escalate_after:
            queued += await _notify_once(ctx, state, info, "escalation", "escalate", now_ms=now_ms, provider=holder)
    fields = {"pending": str(len(pending)), "queued": str(queued)}
    await record_run(broker, "notify", slot, worker=config.worker_name, fields=fields)
    return queued


async def _notify_once(
    ctx: dict[str, Any],
    state: _State,
    info: PendingInfo,
    kind: NoticeKind,
    target: _Target,
    *,
    now_ms: int,
    provider: str | None,
) -> int:
    """Queue the deliveries of one notice, unless this request was notified at this level before."""
    config, broker = state.config, state.broker
    if not await mark_notified(broker, info.request_id, target, ttl=broker.request_ttl):
        return 0
    body = payload(kind, config.namespace, info, now_ms=now_ms, provider=provider, fmt=config.webhook_format)
    count = len(config.webhook_urls) if target == "notify" else 1
    queued = 0
    try:
        for index in range(count):
            delivery_id = f"qb:{config.namespace}:{info.request_id}:{target}:{index}"
            job = await ctx["redis"].enqueue_job(
                "deliver_webhook", target, index, body, delivery_id, kind, info.request_id, _job_id=delivery_id
            )
            queued += job is not None  # None: arq holds that delivery already
    except BaseException:
        await unmark_notified(broker, info.request_id, target)
        raise
    log.info(
        "notifying (%s) about request %s of agent %s in %s",
        kind,
        info.request_id,
        info.agent_id or "-",
        config.namespace,
    )
    return queued


# -- the delivery job -----------------------------------------------------------------------


async def deliver_webhook(
    ctx: dict[str, Any], target: _Target, index: int, body: bytes, delivery_id: str, kind: str, request_id: str
) -> str:
    """One signed POST; retried with exponential backoff, given up (logged, counted) after ``attempts``."""
    state: _State = ctx["qb"]
    config = state.config
    urls = config.webhook_urls if target == "notify" else (config.escalation_url,)
    url = urls[index] if index < len(urls) else None
    if url is None:
        log.warning("dropping delivery %s: no %s URL %d is configured any more", delivery_id, target, index)
        return "dropped"
    attempt: int = ctx["job_try"]
    try:
        status = await post(
            state.session,
            url,
            body,
            secret=config.webhook_secret,
            delivery_id=delivery_id,
            http_timeout=config.http_timeout,
        )
        problem = None if 200 <= status < 300 else f"HTTP {status}"
    except (aiohttp.ClientError, TimeoutError) as error:
        problem = f"{type(error).__name__}: {error}"
    ns = config.namespace
    if problem is None:
        NOTIFICATIONS.labels(ns, kind, "delivered").inc()
        log.info("delivered %s notice %s for request %s (attempt %d)", kind, delivery_id, request_id, attempt)
        return "delivered"
    if attempt >= config.attempts:
        NOTIFICATIONS.labels(ns, kind, "failed").inc()
        log.error(
            "gave up on %s notice %s for request %s after %d attempts: %s",
            kind,
            delivery_id,
            request_id,
            attempt,
            problem,
        )
        return "failed"
    NOTIFICATIONS.labels(ns, kind, "retried").inc()
    delay = min(config.backoff_max, config.backoff * 2 ** (attempt - 1))
    log.warning(
        "%s notice %s for request %s failed (attempt %d: %s); retrying in %.1fs",
        kind,
        delivery_id,
        request_id,
        attempt,
        problem,
        delay,
    )
    raise Retry(defer=delay)


# -- arq settings ---------------------------------------------------------------------------


def _every(interval: int) -> dict[str, Any]:
    if interval < 60:
        return {"second": set(range(0, 60, interval))}
    return {"minute": set(range(0, 60, interval // 60)), "second": 0}


def worker_settings(config: MaintenanceConfig) -> dict[str, Any]:
    """arq ``WorkerSettings`` (as keyword arguments of ``arq.Worker``) for ``config``."""
    timeout = max(30, config.interval * 3)
    ns, every = config.namespace, _every(config.interval)
    cron_jobs: list[CronJob] = [
        # arq's job ids are global to its Redis: the namespace keeps two namespaces' crons apart.
        cron(housekeeping, name=f"housekeeping:{ns}", run_at_startup=True, timeout=timeout, **every),
        cron(notify, name=f"notify:{ns}", run_at_startup=True, timeout=timeout, **every),
    ]
    return {
        "functions": [func(deliver_webhook, name="deliver_webhook", max_tries=config.attempts)],
        "cron_jobs": cron_jobs,
        "redis_settings": RedisSettings.from_dsn(config.arq_redis_url or config.redis_url),
        "queue_name": config.queue_name,
        "on_startup": _startup,
        "on_shutdown": _shutdown,
        "ctx": {"config": config},
        "job_serializer": serialize,
        "job_deserializer": deserialize,
        "poll_delay": config.poll_delay,
        "keep_result": 3600,
        "max_tries": config.attempts,
        "job_timeout": timeout,
    }


def build_worker(config: MaintenanceConfig, **overrides: Any) -> Worker:
    """An arq worker for ``config``; run it with ``await worker.async_run()`` then ``close()``."""
    return Worker(**{**worker_settings(config), **overrides})
