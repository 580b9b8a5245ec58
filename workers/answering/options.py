"""Flags every answering command shares: the quorum policies and the users file naming their groups.

Standard library only: command modules import this to build ``--help`` without loading an engine.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["add_policy_arguments"]


def add_policy_arguments(parser: argparse.ArgumentParser, *, policy_help: str, users_help: str) -> None:
    """``--policy-file`` and ``--users-file``, each defaulting to its environment variable."""
    parser.add_argument(
        "--policy-file",
        type=Path,
        default=os.environ.get("QBROKER_POLICY_FILE") or None,
        metavar="FILE",
        help=f"{policy_help} (docs/approvals.md; env QBROKER_POLICY_FILE)",
    )
    parser.add_argument(
        "--users-file",
        type=Path,
        default=os.environ.get("QBROKER_WEB_USERS") or None,
        metavar="FILE",
        help=f"{users_help} (env QBROKER_WEB_USERS)",
    )
