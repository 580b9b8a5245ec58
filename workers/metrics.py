"""Prometheus metrics shared by every long-running process (web, provide, auto, worker).

The metrics live in prometheus-client's default registry, defined once here; a process
serves them with :func:`serve_metrics` (``--metrics-port``) or mounts
``prometheus_client.make_asgi_app()`` at ``/metrics``. Every metric carries the namespace.

Who sets what: asks by outcome and time to answer are namespace-wide, counted once across
the fleet by the maintenance worker from the audit stream (so providers do not count them
again); pending requests and dead letters are gauges the maintenance worker refreshes every
run; lease acquisitions and losses are counted by each provider process
(:func:`lease_acquired`, :func:`lease_lost`); notifications by the worker that sends them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

__all__ = [
    "ASKS",
    "DEAD_LETTERS",
    "HOUSEKEEPING",
    "LEASE_ACQUISITIONS",
    "LEASE_LOSSES",
    "NOTIFICATIONS",
    "PENDING",
    "REJECTED",
    "TIME_TO_ANSWER",
    "MetricsServer",
    "lease_acquired",
    "lease_lost",
    "serve_metrics",
]

log = logging.getLogger(__name__)

PENDING = Gauge("qbroker_pending_requests", "Requests asked and not yet settled or withdrawn", ["namespace"])
ASKS = Counter(
    "qbroker_asks",
    "Asks by how they ended: answered, cancelled, withdrawn, expired, timed_out, aborted, failed",
    ["namespace", "outcome"],
)
TIME_TO_ANSWER = Histogram(
    "qbroker_time_to_answer_seconds",
    "From ask to the human's answer (or dismissal)",
    ["namespace"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
)
REJECTED = Counter(
    "qbroker_rejected_answers",
    "Answers (and remembered decisions) an asker refused: unsigned, badly signed, or signed for another request "
    "(a forgery, or a provider whose key the askers do not trust; docs/security.md)",
    ["namespace"],
)
LEASE_ACQUISITIONS = Counter("qbroker_lease_acquisitions", "Provider leases taken by this process", ["namespace"])
LEASE_LOSSES = Counter("qbroker_lease_losses", "Provider leases this process lost (fenced)", ["namespace"])
DEAD_LETTERS = Gauge("qbroker_dead_letters", "Poison stream entries held in the dead-letter stream", ["namespace"])
NOTIFICATIONS = Counter(
    "qbroker_notifications",
    "Webhook notifications by result: delivered (counted once), retried (one failed attempt), failed (given up)",
    ["namespace", "kind", "result"],
)
HOUSEKEEPING = Counter(
    "qbroker_housekeeping_actions",
    "What housekeeping did: withdrawn, expired, stale entries, audit entries trimmed, standbys dropped, runs",
    ["namespace", "action"],
)


def lease_acquired(namespace: str) -> None:
    """Call when this process's provider takes the lease (``async with broker.provider(...)`` entered)."""
    LEASE_ACQUISITIONS.labels(namespace).inc()


def lease_lost(namespace: str) -> None:
    """Call when this process's provider was fenced (``provider.lost`` became true)."""
    LEASE_LOSSES.labels(namespace).inc()


@dataclass(frozen=True)
class MetricsServer:
    """The running ``/metrics`` HTTP server (a daemon thread); ``close()`` stops it."""

    server: WSGIServer
    thread: Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve the default registry on ``http://addr:port/metrics`` (port 0: any free port)."""
    server, thread = start_http_server(port, addr)
    metrics = MetricsServer(server, thread)
    log.info("serving metrics on http://%s:%d/metrics", addr, metrics.port)
    return metrics
