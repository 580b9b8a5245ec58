"""The benchmark's key pair: made once per run, handed to every process it starts through the environment.

Providers sign their answers with it and askers verify them (docs/security.md), as in production.
"""

from __future__ import annotations

import os
from typing import Any

from broker import SigningKey

SIGNING_KEY = (
    SigningKey.from_text(os.environ["QBROKER_SIGNING_KEY"])
    if os.environ.get("QBROKER_SIGNING_KEY")
    else SigningKey.generate()
)
ENV = {"QBROKER_SIGNING_KEY": SIGNING_KEY.to_text(), "QBROKER_TRUSTED_KEYS": SIGNING_KEY.public_text}
"""for the qbroker processes a benchmark starts"""
os.environ.update(ENV)
KEYS: dict[str, Any] = {"signing_key": SIGNING_KEY}
"""Broker keyword arguments: sign as a provider, trust the key as an asker"""
