"""What a provider is configured with: the lease's TTL, the answers' lifetimes, the request limits."""

from __future__ import annotations

from dataclasses import dataclass

from ..signing import TrustedKeys
from ..validation import Limits

__all__ = ["ProviderSettings"]


@dataclass(frozen=True, kw_only=True)
class ProviderSettings:
    lease_ttl: float
    result_ttl: float
    audit_maxlen: int
    dead_maxlen: int
    limits: Limits
    min_replicas: int = 0
    replica_timeout: float = 1.0
    liveness_grace: float = 0.0
    """after a Redis start, how long askers have to beat again before any is judged gone"""
    gateway_keys: TrustedKeys | None = None
    """the pinned gateway public keys: an ask they attested shows its agent id as verified"""

    @property
    def block_s(self) -> float:
        """How long one blocking read of a provider or standby blocks."""
        return max(0.1, self.lease_ttl / 4)

    @property
    def reclaim_every(self) -> float:
        """How often the holder claims entries idle in any consumer's pending list."""
        return max(0.2, self.lease_ttl / 2)
