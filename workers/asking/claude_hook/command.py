"""``qbroker claude-hook``: a Claude Code hook that asks the namespace's provider.

Claude Code runs it with the hook payload on stdin: on ``PermissionRequest`` (its permission dialog
is about to appear) it asks "Allow Bash: `rm -rf build`?"; on ``PreToolUse`` of ``AskUserQuestion``
it asks Claude's own questions, of ``ExitPlanMode`` a plan review; it prints the event's decision JSON.
The work is in ``workers.asking.claude_hook.hook``, imported only when the command runs.
"""

from __future__ import annotations

import argparse

from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "claude-hook",
        help="a Claude Code hook (PermissionRequest; PreToolUse of AskUserQuestion, ExitPlanMode): ask the provider",
        description="Read a Claude Code hook payload on stdin and ask the namespace's provider. PermissionRequest: "
        "'Allow TOOL: ...?' (Allow / Allow and remember / Deny / Deny and stop; an 'Other' note denies and is shown "
        "to Claude). "
        "PreToolUse of AskUserQuestion: Claude's questions, answered through updatedInput; of ExitPlanMode: a plan "
        "review. Prints the event's decision JSON on stdout; nothing for other events (they pass through). When "
        "nobody can answer (NO_PROVIDER, a timeout, Redis unavailable) Claude Code asks locally; in a headless session "
        "(claude -p, the Agent SDK) the call is denied with the coded reason instead.",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=590.0,
        metavar="SECONDS",
        help="wait this long for an answer (default 590: under Claude Code's 600 s command hook timeout; "
        'keep it below the hook\'s "timeout")',
    )
    parser.add_argument(
        "--on-unavailable",
        choices=("ask", "deny"),
        default="ask",
        help="when nobody answers in time or no provider runs (default ask: Claude Code asks locally)",
    )
    parser.add_argument(
        "--session",
        choices=("auto", "interactive", "headless"),
        default="auto",
        help="whether Claude Code can show its own dialog (default auto: headless when CLAUDE_CODE_ENTRYPOINT is "
        "sdk-*, as for claude -p and the Agent SDK). Headless, a call nobody on the team decides is denied with the "
        "coded reason as the message Claude reads, since Claude Code would deny it without one",
    )
    parser.add_argument(
        "--headless",
        choices=("deny", "wait"),
        default="deny",
        help="in a headless session, when no provider runs or Redis is unreachable: deny at once with the reason "
        "(default), or keep asking until --timeout",
    )
    parser.add_argument(
        "--local-grace",
        type=float,
        metavar="SECONDS",
        help="after this long without a team answer, withdraw the question and let Claude Code's own dialog ask "
        "the local user (default: the team may answer until --timeout; in an interactive session the local user "
        "can answer Claude Code's permission dialog meanwhile anyway, and the first answer wins)",
    )
    parser.add_argument(
        "--gateway",
        dest="gateway_url",
        metavar="URL",
        help="ask through `qbroker gateway` (env QBROKER_GATEWAY_URL) with the token in QBROKER_GATEWAY_TOKEN "
        "(or _FILE): the hook then needs no Redis credentials, and the token decides the agent id",
    )
    parser.add_argument(
        "--agent",
        metavar="ID",
        help="ask as this agent id (default claude-code-<session_id>: one agent per Claude Code session)",
    )
    parser.add_argument(
        "--remember-in",
        choices=("session", "localSettings"),
        default="session",
        help="where 'Allow and remember' keeps its allow rule: the session (default) or the project's "
        ".claude/settings.local.json",
    )
    parser.add_argument(
        "--remember",
        action="store_true",
        help="let a broker-remembered decision answer a tool call the question names completely (its whole input, "
        "untruncated, and the directory); off by default: every call reaches a human",
    )
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    from workers.asking.claude_hook.hook import hook

    return await hook(args)
