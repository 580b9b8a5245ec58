"""Who may write each key of a namespace: one Redis ACL user per role (docs/security.md).

Three roles, each its own Redis user:

- **asker**: the agents (the library's asking side, ``qbroker ask``, ``mcp``, ``claude-hook``).
  It writes only what asking needs: its requests and their hashes, the outcome keys it collects,
  keyed asks' durable keys, agent records and liveness, inboxes, the away set, the gateways' beats
  (``gateways``: a gateway is an asker; ``qbroker status`` shows them as what they say), its own log
  (``asklog``: what askers say they did), and attachments (``att:<sha256>``: a text too large for a
  card, which a page shows only when its bytes hash to the digest a question named). It may read
  the lease and standbys (``NO_PROVIDER``) and the decisions (``ask.lua``'s lookup, whose finds it
  verifies), and nothing else: it cannot write the lease, the epoch or the decisions, nor read or
  write the audit (every agent's questions and answers), the web's sessions and throttles, or the
  maintenance worker's keys.
- **answerer**: providers (``qbroker web``, ``provide``, ``auto``): the whole namespace, and ``INFO``
  (deliver.lua reads the server's uptime: after a restart, askers get time to beat again); it alone
  (with maintenance) writes ``approvals:*``, the votes so far on a card a quorum policy
  covers (broker/answering/quorum.py): an asker that could write them could approve its own question; and alone among
  the roles (with maintenance) the lease, the epoch and the ``handover`` reservation (a page asking the
  holder for the lease).
- **maintenance**: ``qbroker worker`` and operators' ``qbroker status`` / ``decisions``: the
  whole namespace, and arq's queue when it shares the Redis. Its workers refresh ``maint:alive``
  (``Keys.worker_alive``); while it is absent the lease holder (answerer) reaps, expires and ends
  away asks itself. An asker may not write it (``maint:*``): a forged one would stop that.

Every role is refused ``SCAN`` (ACLs do not filter it by key), ``FUNCTION`` (its subcommands are
in ``@write``; ``FUNCTION FLUSH`` would drop every tenant's library), ``KEYS`` and everything
``@dangerous``. Where an ACL cannot tell a forged value from a genuine one (an asker may write
the outcome keys and inboxes it reads), signatures do (broker/signing.py).
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from ._keys import Keys

__all__ = ["ROLES", "Role", "acl_rule", "acl_user"]

Role = Literal["asker", "answerer", "maintenance"]
ROLES: Final[tuple[Role, ...]] = ("asker", "answerer", "maintenance")

_COMMANDS: Final = (
    "-@all +@read +@write +@stream +@list +@hash +@string +@keyspace +@sortedset "
    "+evalsha +eval +ping +time +client|setname +client|id -@dangerous -scan -keys -function"
)
_ASKER_WRITES: Final = (
    "requests",
    "req:*",
    "ans:*",
    "key:*",
    "agent:*",
    "agents",
    "client:*",
    "inbox:*",
    "away",
    "asklog",
    "att:*",
    "gateways",
)
"""the key families an asker writes (relative to the namespace's prefix): its own log, never the audit"""
_ASKER_READS: Final = ("provider", "standbys", "decision:*", "decisions", "decisions:expiry")
"""what an asker reads and never writes: the lease and standbys, the remembered decisions"""
_ARQ: Final = "~qbroker:{namespace}* ~arq:* +@transaction +info"
"""the maintenance worker's arq queue and job keys, MULTI/EXEC/WATCH, and INFO, when arq shares the Redis"""
_ANSWERER: Final = "+info"
"""INFO, for the server's uptime: deliver.lua judges no asker gone while a restart may have dropped live ones' keys"""


def acl_rule(namespace: str, role: Role) -> str:
    """The ACL rule (key patterns and commands) of ``role`` in ``namespace``, without user or password."""
    prefix = Keys(namespace).prefix
    if role == "asker":
        patterns = [f"~{prefix}{family}" for family in _ASKER_WRITES]
        patterns += [f"%R~{prefix}{family}" for family in _ASKER_READS]
    elif role in ("answerer", "maintenance"):
        patterns = [f"~{prefix}*"]
    else:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    rule = " ".join(patterns) + " " + _COMMANDS
    if role == "answerer":
        rule += " " + _ANSWERER
    if role == "maintenance":
        rule += " " + _ARQ.format(namespace=namespace)
    return rule


def acl_user(namespace: str, role: Role, password: str) -> str:
    """A ``user`` line for redis.conf or an aclfile; the password is stored as its SHA-256 only."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"user {namespace}-{role} on #{digest} {acl_rule(namespace, role)}"
