"""What ``qbroker mcp`` is started with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["McpSettings"]


@dataclass(frozen=True, kw_only=True)
class McpSettings:
    redis_url: str
    namespace: str
    transport: Literal["stdio", "http"] = "stdio"
    agent_id: str | None = None
    timeout: float | None = None
    host: str = "127.0.0.1"
    port: int = 8765
    trusted_keys: str = ""
    """the providers' public keys (qbpk1:...): an answer counts only when one of them signed it"""
    progress_interval: float = 10.0
    tokens_file: str | None = None
    """over HTTP: every request needs a bearer token from this file, and asks as the token's agent"""

    def __repr__(self) -> str:  # the URL may carry a password
        return f"McpSettings(namespace={self.namespace!r}, transport={self.transport!r}, agent_id={self.agent_id!r})"
