"""The web server's own Prometheus metrics (the shared ones live in ``workers.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter

__all__ = ["SIGN_INS"]

SIGN_INS = Counter(
    "qbroker_web_sign_ins",
    "Sign-in attempts on the web page by result: ok, refused, throttled",
    ["namespace", "result"],
)
