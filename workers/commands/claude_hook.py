"""``qbroker claude-hook``: a Claude Code ``PreToolUse`` hook that asks the namespace's provider.

Claude Code runs it before a tool call with the hook payload on stdin; it asks "Allow Bash:
`rm -rf build`?" (Allow / Deny, a note as "Other") and prints the hook decision JSON.
The work is in ``workers.claude_hook``, imported only when the command runs.
"""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "claude-hook",
        help="a Claude Code PreToolUse hook: ask the provider whether a tool call may run",
        description="Read a Claude Code PreToolUse hook payload on stdin, ask the namespace's provider "
        "'Allow TOOL: ...?' (Allow / Deny; an 'Other' note denies and is shown to Claude) and print the "
        "hook decision JSON on stdout (permissionDecision allow, deny or ask). When nobody can answer "
        "(NO_PROVIDER, a timeout, Redis unavailable) the decision is 'ask': Claude Code's own prompt.",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=50.0,
        metavar="SECONDS",
        help="wait this long for an answer (default 50: under Claude Code's 60 s hook timeout; raise both together)",
    )
    parser.add_argument(
        "--on-unavailable",
        choices=("ask", "deny"),
        default="ask",
        help="the decision when nobody answers in time or no provider runs (default ask: Claude Code prompts)",
    )
    parser.add_argument(
        "--agent",
        metavar="ID",
        help="ask as this live root agent (default claude-code-<tool_use_id>, registered for the ask)",
    )
    parser.add_argument(
        "--remember",
        action="store_true",
        help="let a remembered decision answer a tool call the question names completely (its whole input, "
        "untruncated, and the directory); off by default: every call reaches a human",
    )
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from ..claude_hook import hook

    return await hook(args)
