"""A broker's settings and keys: frozen records, built once from ``Broker(...)``'s arguments; what every side
needs of an open broker (``Namespace``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ._commands import Commands
from ._keys import Keys
from .errors import BAD_REQUEST, UserQuestionError
from .signing import SigningKey, TrustedKeys
from .validation import Limits

__all__ = ["BrokerSettings", "Namespace", "Trust"]


@dataclass(frozen=True, kw_only=True)
class BrokerSettings:
    """How one broker treats its namespace (``Broker``'s docstring says what each does)."""

    namespace: str
    lease_ttl: float
    agent_ttl: float
    client_ttl: float
    request_ttl: float
    result_ttl: float
    audit_maxlen: int
    dead_maxlen: int
    unavailable_after: float
    connect_timeout: float
    sweep_every: float
    min_replicas: int
    replica_timeout: float
    detach_grace: float
    limits: Limits
    housekeeping_every: float | None
    """while a provider of this broker holds the lease and no maintenance worker is alive, it reaps, expires
    and ends away asks this often (seconds); None: never (leave it to ``qbroker worker``)"""

    @property
    def liveness_grace(self) -> float:
        """After a Redis start, how long askers have to beat again before any is judged gone."""
        return max(self.agent_ttl, self.client_ttl)


@dataclass(frozen=True)
class Trust:
    """Whose signatures count here, and what this broker signs and attests with."""

    trusted_keys: TrustedKeys
    """the answering side's public keys: an answer counts only when one of them signed it for its request"""
    signing_key: SigningKey | None
    """what a provider of this broker signs its answers with"""
    attest_key: SigningKey | None
    """a gateway's own key: attests each ask this broker enqueues"""
    gateway_keys: TrustedKeys
    """the pinned gateways' public keys: an ask one of them attested shows a verified agent id"""

    @classmethod
    def of(
        cls,
        trusted_keys: TrustedKeys | Iterable[str] | str,
        signing_key: SigningKey | str | None,
        attest_key: SigningKey | str | None,
        gateway_keys: TrustedKeys | Iterable[str] | str,
    ) -> Trust:
        """Parse ``Broker``'s key arguments; a broker trusts its own signing key's public half."""
        # A copy: adding this broker's own key below must not make another broker sharing the object trust it.
        trusted = _copy(trusted_keys)
        signing = SigningKey.from_text(signing_key) if isinstance(signing_key, str) else signing_key
        if signing is not None:
            trusted.add(signing)
        attest = SigningKey.from_text(attest_key) if isinstance(attest_key, str) else attest_key
        if attest is not None and attest.id in trusted.ids:
            # Whoever holds a key answers trust could sign answers: a gateway must never hold one.
            raise UserQuestionError("the gateway key must not be a key answers are signed with", BAD_REQUEST)
        return cls(trusted, signing, attest, _copy(gateway_keys))


def _copy(keys: TrustedKeys | Iterable[str] | str) -> TrustedKeys:
    if isinstance(keys, str):
        keys = TrustedKeys.parse(keys)
    return TrustedKeys(keys.keys if isinstance(keys, TrustedKeys) else keys)


class Namespace(Protocol):
    """What housekeeping needs of an open ``Broker``: its commands, keys and settings."""

    @property
    def commands(self) -> Commands: ...
    @property
    def keys(self) -> Keys: ...
    @property
    def settings(self) -> BrokerSettings: ...
