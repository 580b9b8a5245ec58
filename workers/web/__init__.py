"""The web provider: a page (and JSON API) where a team answers its agents' questions."""

from __future__ import annotations

from .app import create_app
from .config import ConfigError, Credentials, WebConfig, hash_password, load_credentials, verify_password
from .service import WebProvider

__all__ = [
    "ConfigError",
    "Credentials",
    "WebConfig",
    "WebProvider",
    "create_app",
    "hash_password",
    "load_credentials",
    "verify_password",
]
