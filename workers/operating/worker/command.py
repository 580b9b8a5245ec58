"""``qbroker worker``: the maintenance worker (arq): housekeeping cron jobs and webhook notifications.

Flags win over the environment. The shared connection flags (``--redis-url``, ``--namespace``)
come from the CLI's settings (``args.settings``) when present, else from ``QBROKER_REDIS_URL``
and ``QBROKER_NAMESPACE``. Run standalone with ``python -m workers.operating.worker.command``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workers.settings import Subparsers

if TYPE_CHECKING:  # arq, aiohttp and prometheus_client load only when the worker runs
    from workers.operating.worker.maintenance import MaintenanceConfig

__all__ = ["ENV_VARS", "config_from_args", "main", "register", "run"]

log = logging.getLogger(__name__)

ENV_VARS: Mapping[str, str] = {
    "arq_redis_url": "QBROKER_ARQ_REDIS_URL",
    "queue_name": "QBROKER_ARQ_QUEUE",
    "interval": "QBROKER_MAINTENANCE_INTERVAL",
    "webhook_url": "QBROKER_WEBHOOK_URLS",  # comma-separated
    "webhook_secret": "QBROKER_WEBHOOK_SECRET",
    "webhook_format": "QBROKER_WEBHOOK_FORMAT",
    "notify_after": "QBROKER_NOTIFY_AFTER",
    "unattended_after": "QBROKER_UNATTENDED_AFTER",
    "escalation_url": "QBROKER_ESCALATION_URL",
    "escalate_after": "QBROKER_ESCALATE_AFTER",
    "attempts": "QBROKER_WEBHOOK_ATTEMPTS",
    "backoff": "QBROKER_WEBHOOK_BACKOFF",
    "audit_maxlen": "QBROKER_AUDIT_MAXLEN",
    "metrics_port": "QBROKER_METRICS_PORT",
}


def _add_flags(parser: argparse.ArgumentParser) -> None:
    def add(flag: str, text: str, **options: Any) -> None:
        env = ENV_VARS[flag[2:].replace("-", "_")]
        parser.add_argument(flag, help=f"{text} (env {env})", **options)

    add("--arq-redis-url", "arq's queue Redis, when not the broker's", metavar="URL")
    add("--queue-name", "arq queue name; default qbroker:maintenance", metavar="NAME")
    add("--interval", "seconds between runs; default 10", metavar="SECONDS", type=int)
    add("--webhook-url", "POST notifications here; repeatable (env: comma-separated)", metavar="URL", action="append")
    add("--webhook-secret", "HMAC-SHA256 signing key", metavar="SECRET")
    add("--webhook-format", "body format; default json", choices=("json", "slack"))
    add("--notify-after", "seconds a question waits before notifying; default 300", metavar="SECONDS", type=float)
    add("--unattended-after", "seconds queued with no provider before notifying; default 30", metavar="S", type=float)
    add("--escalation-url", "POST escalations here", metavar="URL")
    add("--escalate-after", "seconds a question waits before escalating", metavar="SECONDS", type=float)
    add("--attempts", "delivery attempts before giving up; default 5", type=int)
    add("--backoff", "first retry delay in seconds, doubled each time; default 1", metavar="SECONDS", type=float)
    add("--audit-maxlen", "cap of the audit stream; default 10000", type=int)
    add("--metrics-port", "serve Prometheus /metrics on this port", type=int)
    parser.add_argument("--metrics-addr", default="127.0.0.1", help="address of the metrics server (default 127.0.0.1)")


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="run the maintenance worker (housekeeping, webhook notifications)",
        description="An arq worker: reaps requests of gone askers, expires deadlines, caps the audit stream, "
        "and POSTs signed webhook notifications for questions left waiting. Several may run at once.",
    )
    _add_flags(parser)
    parser.set_defaults(func=run)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> MaintenanceConfig:
    """Flags, then the environment, then the defaults."""
    from workers.operating.worker.maintenance import MaintenanceConfig

    env = os.environ if environ is None else environ

    def pick(name: str, env_name: str | None = None) -> Any:
        flag = getattr(args, name, None)
        if flag is not None:
            return flag
        return env.get(env_name or ENV_VARS[name]) or None

    settings = getattr(args, "settings", None)
    redis_url = settings.redis_url if settings is not None else pick("redis_url", "QBROKER_REDIS_URL")
    namespace = settings.namespace if settings is not None else pick("namespace", "QBROKER_NAMESPACE")
    urls = pick("webhook_url")
    if isinstance(urls, str):
        urls = [u.strip() for u in urls.split(",") if u.strip()]
    options: dict[str, Any] = {
        "redis_url": redis_url or "redis://localhost:6379/0",
        "namespace": namespace or "default",
        "arq_redis_url": pick("arq_redis_url"),
        "webhook_urls": tuple(urls or ()),
        "escalation_url": pick("escalation_url"),
        "webhook_secret": pick("webhook_secret") or "",
    }
    for name, convert in (
        ("queue_name", str),
        ("interval", int),
        ("webhook_format", str),
        ("notify_after", float),
        ("unattended_after", float),
        ("escalate_after", float),
        ("attempts", int),
        ("backoff", float),
        ("audit_maxlen", int),
    ):
        value = pick(name)
        if value is not None:
            options[name] = convert(value)
    return MaintenanceConfig(**options)


async def run(args: argparse.Namespace) -> int:
    """Run the worker until SIGINT or SIGTERM."""
    from workers.metrics import serve_metrics

    try:
        config = config_from_args(args)
    except ValueError as error:
        log.error("%s", error)
        return 2
    port = getattr(args, "metrics_port", None) or os.environ.get(ENV_VARS["metrics_port"])
    metrics = serve_metrics(int(port), getattr(args, "metrics_addr", "127.0.0.1")) if port else None
    try:
        await _serve(config)
    finally:
        if metrics is not None:
            metrics.close()
    return 0


async def _serve(config: MaintenanceConfig) -> None:
    """Run arq's worker until SIGINT or SIGTERM, starting it again whenever Redis fails it.

    arq's poll loop lets a connection error out of ``async_run`` (Redis restarted, failed over,
    briefly unreachable): the worker is built anew after a backoff, as ``web`` and ``provide``
    ride an outage out. Its jobs are idempotent and claimed in Redis, so nothing runs twice.
    """
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from broker.backoff import Backoff
    from workers.operating.worker.maintenance import build_worker

    backoff = Backoff(first=0.5, cap=10.0)
    loop = asyncio.get_running_loop()
    while True:
        worker = build_worker(config)
        started = loop.time()
        try:
            await worker.async_run()
            return
        except asyncio.CancelledError:
            return  # arq cancels its main task on SIGINT/SIGTERM
        except (RedisConnectionError, RedisTimeoutError, OSError) as error:
            failure = error
        finally:
            try:
                await worker.close()
            except Exception as error:  # closing against a Redis that is down
                log.debug("closing the arq worker: %r", error)
        if loop.time() - started > 60:
            backoff.reset()  # it ran a while: this is a new outage
        delay = backoff.next()
        log.warning("Redis failed the maintenance worker (%r); starting it again in %.1fs", failure, delay)
        if await _stopped_within(delay):
            return


async def _stopped_within(seconds: float) -> bool:
    """Sleep, unless SIGINT or SIGTERM comes first (arq's own handlers went with its worker)."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
        return True
    except TimeoutError:
        return False
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point (the ``qbroker`` CLI calls ``register``/``run`` instead)."""
    parser = argparse.ArgumentParser(prog="qbroker-worker", description=__doc__)
    parser.add_argument("--redis-url", help="the broker's Redis (env QBROKER_REDIS_URL)")
    parser.add_argument("--namespace", help="namespace (env QBROKER_NAMESPACE)")
    parser.add_argument("--log-level", default=os.environ.get("QBROKER_LOG_LEVEL", "INFO"))
    _add_flags(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
