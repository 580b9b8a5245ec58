"""Every Redis key name of a namespace, built in one place.

Each key carries the hash tag ``{ns}`` so that a namespace lives in one Redis Cluster
slot and every script touches one slot.
"""

from __future__ import annotations

import hashlib
import re

from .errors import BAD_REQUEST, UserQuestionError

__all__ = ["GROUP", "TOMBSTONE_MS", "Keys"]

GROUP = "providers"
TOMBSTONE_MS = 60_000
"""how long a settled request's slim hash outlives the asker's clean-up (settled_cleanup.lua)"""
_NAMESPACE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


class Keys:
    """The key layout of DESIGN.md Part 2 for one namespace."""

    __slots__ = (
        "agents",
        "asklog",
        "audit",
        "audit_automatic",
        "audit_head",
        "audit_human",
        "audit_human_head",
        "away",
        "dead",
        "decision_expiry",
        "decisions",
        "epoch",
        "gateways",
        "handover",
        "lease_record",
        "lease_signal",
        "namespace",
        "prefix",
        "provider",
        "reap_cursor",
        "requests",
        "standbys",
        "worker_alive",
    )

    def __init__(self, namespace: str) -> None:
        if not _NAMESPACE.match(namespace):
            raise UserQuestionError(f"namespace {namespace!r} must be 1-100 of letters, digits and _.:-", BAD_REQUEST)
        self.namespace = namespace
        self.prefix = f"qb:{{{namespace}}}:"
        self.requests = self.prefix + "requests"
        self.provider = self.prefix + "provider"
        self.epoch = self.prefix + "epoch"
        self.standbys = self.prefix + "standbys"
        self.lease_signal = self.prefix + "lease-released"
        self.lease_record = self.prefix + "lease-record"
        """string ``<server run id> <lease value>``, PX 3 lease TTLs: the lease as last acquired or renewed, and under
        which run of the server (scripts/_kept.lua); a lease that lapsed while Redis restarted is kept for its
        holder (answerers only, like the lease)"""
        self.handover = self.prefix + "handover"
        """string ``<provider name>\n<who asked>``, PX TTL: the lease holder is asked to hand the lease to that
        provider, and the lease is kept for it meanwhile (written by the answering side only)"""
        self.audit = self.prefix + "audit"
        """capped stream: what the answering side and the maintenance worker did (askers may not write it)"""
        self.audit_head = self.audit + ":head"
        """the audit chain's head, '<entry id> <chain>': the scripts build this name from the audit key
        (scripts/_audit.lua), so it is always the audit key plus ':head'"""
        self.audit_human = self.audit + ":human"
        """capped stream: a copy of the audit's entries of a person's decisions (answers, cancels, votes, decisions
        remembered and forgotten), which no asker-caused entry enters; built by the scripts from the audit key"""
        self.audit_human_head = self.audit_human + ":head"
        """the human record's head, '<entry id> <chain>' (the scripts build it from the audit key)"""
        self.audit_automatic = self.audit + ":automatic"
        """string: the lease's epoch while an automatic provider holds it (answerers only): its settlements are no
        person's decisions and stay out of the human record, which an asker's volume of them would otherwise fill"""
        self.asklog = self.prefix + "asklog"
        """capped stream: what askers say they did (asked, withdrew, detached, re-attached, answered by a
        remembered decision); written with asking credentials, so a claim, never evidence (docs/security.md)"""
        self.dead = self.prefix + "dead"
        self.agents = self.prefix + "agents"
        """a zset of agent ids scored by when their record expires (unix ms): read without SCAN"""
        self.away = self.prefix + "away"
        """a zset of keyed request ids whose asker is away, scored by when their grace ends (unix ms)"""
        self.decisions = self.prefix + "decisions"
        """a hash: remembered decision id -> its decision key (list and revoke without SCAN)"""
        self.decision_expiry = self.prefix + "decisions:expiry"
        """a zset: remembered decision id scored by its expiry (unix ms), to prune the index"""
        self.gateways = self.prefix + "gateways"
        """a zset of the running gateways' names scored by when each lapses unless it beats again (unix ms, Redis
        clock); written by the gateways with the asker's credentials, so what gateways say of themselves"""
        self.worker_alive = self.prefix + "maint:alive"
        """string, a maintenance worker's name, PX a few of its intervals: some worker runs housekeeping (every worker
        refreshes it each run); while it is absent the lease holder reaps, expires and ends away asks itself"""
        self.reap_cursor = self.prefix + "maint:reap-cursor"
        """string, the requests stream entry id a paced housekeeping pass has reached (housekeeping.housekeep_slice),
        PX a few passes; absent: the next round starts a pass (written by the lease holder and the workers)"""

    def request(self, request_id: str) -> str:
        return f"{self.prefix}req:{request_id}"

    def outcome(self, request_id: str) -> str:
        return f"{self.prefix}ans:{request_id}"

    def durable(self, agent_id: str | None, key: str) -> str:
        """Where a keyed ask's current request id is kept: one per (asking agent id, key).

        Hashed, so any agent id and key make a key name of fixed length that nothing else shares.
        """
        digest = hashlib.sha1(f"{agent_id or ''}\0{key}".encode()).hexdigest()
        return f"{self.prefix}key:{digest}"

    def attachment(self, digest: str) -> str:
        """A text a question names by its SHA-256 (broker/attachments.py): written by askers, read by pages."""
        return f"{self.prefix}att:{digest}"

    def agent(self, agent_id: str) -> str:
        return f"{self.prefix}agent:{agent_id}"

    def inbox(self, client_id: str) -> str:
        return f"{self.prefix}inbox:{client_id}"

    def client(self, client_id: str) -> str:
        return f"{self.prefix}client:{client_id}"

    def approvals(self, request_id: str) -> str:
        """The votes so far on a card a quorum policy covers (broker/answering/quorum.py): answerer-only."""
        return f"{self.prefix}approvals:{request_id}"

    def decision(self, fingerprint: str, agent_id: str | None = None) -> str:
        """A remembered decision for a question fingerprint: the namespace's, or one agent's."""
        if agent_id is None:
            return f"{self.prefix}decision:ns:{fingerprint}"
        return f"{self.prefix}decision:agent:{agent_id}:{fingerprint}"
