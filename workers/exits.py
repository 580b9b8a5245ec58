"""Exit statuses of every ``qbroker`` command: one per error code, documented in docs/cli.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = [
    "EXIT_AUDIT_TAMPERED",
    "EXIT_AUDIT_UNCHAINED",
    "EXIT_DETACHED",
    "EXIT_INTERNAL",
    "EXIT_OK",
    "EXIT_STATUS",
    "EXIT_USAGE",
]

EXIT_OK: Final = 0
EXIT_INTERNAL: Final = 1
EXIT_USAGE: Final = 2
EXIT_DETACHED: Final = 75
"""with --key, interrupted: the question stays pending; run the command again to get its answer"""
EXIT_AUDIT_TAMPERED: Final = 20
"""``qbroker audit verify``: something was deleted, altered or inserted"""
EXIT_AUDIT_UNCHAINED: Final = 21
"""``qbroker audit verify``: the audit was never chained"""
# One status per error code; documented in docs/cli.md. Codes an asker cannot meet
# (they belong to providers) still get one, so the table is total.
EXIT_STATUS: Final[Mapping[str, int]] = {
    "BROKER_UNAVAILABLE": 3,
    "BAD_REQUEST": 4,
    "EMPTY_QUESTIONS": 5,
    "BAD_INTENT": 6,
    "NO_PROVIDER": 7,
    "ASK_CANCELLED": 8,
    "ASK_TIMED_OUT": 9,
    "ASK_ABORTED": 10,
    "CALLER_NOT_LIVE": 11,
    "DELEGATED_CALLER": 12,
    "BAD_ANSWER": 13,
    "NOT_PENDING": 14,
    "LEASE_LOST": 15,
    "DUPLICATE_PROVIDER": 16,
    "NO_TRUSTED_KEY": 17,
    "NO_SIGNING_KEY": 18,
    "UNAUTHENTICATED": 19,
    "UNKNOWN_ASK": 20,
    "NO_TOKENS": 21,
    "NOT_APPROVER": 22,
    "PORT_IN_USE": 23,
}
