"""``qbroker mcp``: serve the broker as an MCP server (tool ``ask_user_question``).

Over stdio by default (an MCP client starts it as a subprocess), or streamable HTTP with
``--transport http``. Stdout belongs to the protocol: logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from workers.settings import ENV_VARS, Settings, Subparsers

if TYPE_CHECKING:  # the MCP SDK loads only when the server runs
    from workers.asking.mcp.settings import McpSettings

__all__ = ["register", "settings_from", "main"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "mcp",
        help="serve the ask_user_question tool to MCP clients (stdio or streamable HTTP)",
        description="An MCP server exposing one tool, ask_user_question, that asks through the broker. "
        "The process registers itself as a live root agent.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default stdio")
    parser.add_argument(
        "--agent-id",
        metavar="ID",
        help="the agent id to ask as (default: mcp-<client name>-<random>, one per process)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="default time to wait for an answer before ASK_TIMED_OUT (a call's timeoutSeconds wins)",
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="while a human takes their time, send a call that asked for progress a notification this often "
        "(default 10)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    parser.add_argument(
        "--tokens-file",
        default=os.environ.get("QBROKER_MCP_TOKENS_FILE") or None,
        metavar="FILE",
        help="over HTTP, require a bearer token from this file (made by `qbroker gateway token new AGENT`) and ask as "
        "its agent (env QBROKER_MCP_TOKENS_FILE); without it, HTTP listens on loopback only",
    )
    parser.add_argument(
        "--redis-url", metavar="URL", default=argparse.SUPPRESS, help=f"Redis URL (env {ENV_VARS['redis_url']})"
    )
    parser.add_argument(
        "--namespace", "-n", metavar="NS", default=argparse.SUPPRESS, help=f"namespace (env {ENV_VARS['namespace']})"
    )


def settings_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> McpSettings:
    """The flags, over the shared settings (a flag, then the environment, then the default)."""
    from workers.asking.mcp.settings import McpSettings

    # Run by `qbroker`, the shared settings (built from these same flags); alone, built here the same way:
    # a flag, then the environment, then the default.
    shared: Settings = getattr(args, "settings", None) or Settings.build(args, environ)
    if args.timeout is not None and args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, not {args.timeout}")
    if args.progress_interval <= 0:
        raise ValueError(f"--progress-interval must be positive, not {args.progress_interval}")
    return McpSettings(
        redis_url=shared.redis_url,
        namespace=shared.namespace,
        trusted_keys=shared.trusted_keys,
        transport=args.transport,
        agent_id=args.agent_id,
        timeout=args.timeout,
        host=args.host,
        port=args.port,
        progress_interval=args.progress_interval,
        tokens_file=args.tokens_file,
    )


async def run(args: argparse.Namespace) -> int:
    from broker import UserQuestionError
    from workers.asking.mcp.http_transport import check_listening
    from workers.asking.mcp.server import serve
    from workers.exits import EXIT_STATUS

    settings = settings_from(args)
    try:
        check_listening(settings)
    except UserQuestionError as error:
        print(f"qbroker mcp: {error}", file=sys.stderr, flush=True)
        return EXIT_STATUS[error.code]
    task = asyncio.current_task()
    stop = asyncio.Event()
    # SIGTERM/SIGINT: over stdio, cancel (calls in flight withdraw their questions);
    # over http, begin uvicorn's graceful shutdown. Either way the broker closes cleanly.
    on_signal = task.cancel if settings.transport == "stdio" and task is not None else stop.set
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    with contextlib.suppress(asyncio.CancelledError):
        await serve(settings, stop=stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run without the ``qbroker`` front end: ``python -m workers.asking.mcp.command``."""
    parser = argparse.ArgumentParser(prog="qbroker mcp")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("QBROKER_LOG_LEVEL", "WARNING").upper())
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
