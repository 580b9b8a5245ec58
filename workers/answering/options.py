"""Flags the answering commands share: a provider's name and standby, the quorum policies and the users
file naming their groups.

Standard library only: command modules import this to build ``--help`` without loading an engine.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["add_policy_arguments", "add_provider_arguments"]


def add_provider_arguments(parser: argparse.ArgumentParser, *, default_name: str) -> None:
    """``--name`` and ``--no-standby``: who holds the lease, and whether to wait for it."""
    parser.add_argument("--name", metavar="NAME", help=f"this provider's name (default {default_name})")
    parser.add_argument(
        "--no-standby",
        action="store_true",
        help="fail with DUPLICATE_PROVIDER (exit 16) instead of standing by when another provider holds the lease",
    )


def add_policy_arguments(parser: argparse.ArgumentParser, *, policy_help: str, users_help: str) -> None:
    """``--policy-file`` and ``--users-file``, each defaulting to its environment variable."""
    for flag, env, text in (
        ("--policy-file", "QBROKER_POLICY_FILE", f"{policy_help} (docs/approvals.md; env QBROKER_POLICY_FILE)"),
        ("--users-file", "QBROKER_WEB_USERS", f"{users_help} (env QBROKER_WEB_USERS)"),
    ):
        parser.add_argument(flag, type=Path, default=os.environ.get(env) or None, metavar="FILE", help=text)
