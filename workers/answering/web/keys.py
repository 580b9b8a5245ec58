"""Every Redis key the web server adds to a namespace, built in one place: the web's own schema.

The page's keys sit under ``qb:{<namespace>}:web:``, its Slack face's under ``qb:{<namespace>}:slack:``,
so they share the namespace's Cluster slot (hash tag) and its ACL key pattern (``~qb:{<namespace>}:*``).
Only the answering side writes them (docs/protocol.md, "The web server's keys"); everything else of the
namespace it reads through ``broker.Reads`` and acts on through the broker's provider API.
"""

from __future__ import annotations

import hashlib

__all__ = ["WebKeys", "digest"]


def digest(text: str) -> str:
    """A fixed-length name for asker- or attacker-chosen text (user names, addresses, ids)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class WebKeys:
    __slots__ = ("namespace", "prefix", "sessions", "slack_prefix")

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.prefix = f"qb:{{{namespace}}}:web:"
        self.slack_prefix = f"qb:{{{namespace}}}:slack:"
        self.sessions = self.prefix + "sessions"
        """sorted set: the digests of live sessions (scored by expiry, unix ms), for listing without SCAN"""

    def session(self, session_digest: str) -> str:
        """One session record (a JSON string with a PX TTL), named by the digest of its cookie."""
        return f"{self.prefix}session:{session_digest}"

    def public_url(self, provider_name: str) -> str:
        """The public URL of a web provider's page (PX TTL, refreshed while it serves)."""
        return f"{self.prefix}public-url:{digest(provider_name)}"

    def throttle(self, kind: str, who: str) -> str:
        """A failure counter with a PX TTL: ``kind`` is ``user`` or ``addr``."""
        return f"{self.prefix}throttle:{kind}:{digest(who)}"

    def slack_message(self, request_id: str) -> str:
        """A hash ``{channel, ts}``: the Slack message of a card, so a server that takes the lease over
        updates it rather than posting the card again (PX TTL)."""
        return f"{self.slack_prefix}msg:{request_id}"

    def slack_seen(self, signature: str) -> str:
        """A signed Slack request already taken (PX TTL): a replay of it is refused."""
        return f"{self.slack_prefix}seen:{hashlib.sha256(signature.encode()).hexdigest()}"
