"""``qbroker``: the command-line entry point.

workers/ is grouped by the side a process is on, which is the credential it holds: ``asking/`` (an
asker's Redis user or a gateway token: ``ask``, ``mcp``, ``claude-hook``), ``answering/`` (the
answerer's user and the signing key: ``web``, ``provide``, ``auto``) and ``operating/`` (the
maintenance user: ``worker``, ``status``, ``decisions``, ``keys``, ``acl``); ``bench`` is the
benchmark's own (``benchmarks/command.py``, in a source checkout). Each command lives in one place,
``COMMANDS`` names its module; that module exposes ``register(subparsers)``, which adds its parser
and sets ``func`` (sync or async, taking the parsed arguments, returning an exit status or
``None``). A command module imports only the standard library: its ``run()`` imports the engine (the
broker, the MCP SDK, arq, the web stack, prompt_toolkit), so ``--help`` and each command load only
what they use (tests/workers/test_cli.py checks it). Modules missing from this installation are
skipped. Only this module configures logging.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from workers.settings import BEFORE_THE_COMMAND, Settings, add_arguments

__all__ = ["COMMANDS", "build_parser", "configure_logging", "main"]

COMMANDS: dict[str, str] = {
    "provide": "workers.answering.provide.command",
    "auto": "workers.answering.auto.command",
    "ask": "workers.asking.ask.command",
    "status": "workers.operating.status.command",
    "decisions": "workers.operating.decisions.command",
    "audit": "workers.operating.audit.command",
    "web": "workers.answering.web.command",
    "worker": "workers.operating.worker.command",
    "mcp": "workers.asking.mcp.command",
    "claude-hook": "workers.asking.claude_hook.command",
    "gateway": "workers.asking.gateway.command",
    "keys": "workers.operating.keys",
    "acl": "workers.operating.acl",
    "bench": "benchmarks.command",  # a source checkout's: the workers import nothing of benchmarks/
    "quickstart": "workers.operating.quickstart.command",
}

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qbroker",
        description="Ask humans structured questions through Redis, and answer them: "
        "providers (provide, auto, ...), asking from a shell (ask), and status.",
        epilog="Run `qbroker COMMAND --help` for a command's own flags. See docs/cli.md.",
    )
    add_arguments(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for path in COMMANDS.values():
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as error:
            if error.name is None or not path.startswith(error.name):
                raise  # the module exists but a dependency of it is missing: say so
            continue
        module.register(subparsers)
    for sub in subparsers.choices.values():
        # The shared flags after the sub-command too, unless the command defines its own of that name.
        add_arguments(sub, suppress=True, title=BEFORE_THE_COMMAND)
    return parser


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.build(args)
        level = logging.getLevelName(settings.log_level)
        if not isinstance(level, int):
            raise ValueError(f"unknown log level {settings.log_level!r}")
    except ValueError as error:
        parser.error(str(error))
    configure_logging(settings)
    args.settings = settings
    log.debug("running %s with %r", args.command, settings)
    func = args.func
    try:
        if inspect.iscoroutinefunction(func):
            # A command may name its own event loop (the gateway: uvloop's); asyncio's otherwise.
            with asyncio.Runner(loop_factory=getattr(args, "loop_factory", None)) as runner:
                result = runner.run(func(args))
        else:
            result = func(args)
    except KeyboardInterrupt:
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
