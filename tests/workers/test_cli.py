"""The ``qbroker`` entry point: discovery of sub-commands, help, logging set-up."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import types

import pytest

from workers import cli
from workers.settings import Settings


def test_help_lists_every_installed_command(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for name in ("provide", "auto", "ask", "status"):
        assert name in out
    assert "QBROKER_REDIS_URL" in out and "QBROKER_NAMESPACE" in out


@pytest.mark.parametrize("command", ["provide", "auto", "ask", "status"])
def test_each_command_has_help_with_the_shared_flags(capsys, command):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: qbroker {command}" in out and "--redis-url" in out and "--namespace" in out


def test_missing_command_modules_are_skipped_but_broken_ones_are_not(monkeypatch):
    monkeypatch.setattr(cli, "COMMANDS", {"ask": "workers.asking.ask.command", "gone": "workers.no_such_command"})
    parser = cli.build_parser()
    assert "ask" in parser.format_help() and "gone" not in parser.format_help()

    broken = types.ModuleType("workers.broken")

    def register(_subparsers):
        import this_dependency_is_missing  # type: ignore[import-not-found]  # noqa: F401

    broken.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "workers.broken", broken)
    monkeypatch.setattr(cli, "COMMANDS", {"broken": "workers.broken"})
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--lease-ttl", "-3", "status"])
    assert done.value.code == 2
    assert "lease TTL" in capsys.readouterr().err


def test_json_logging(capsys):
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        cli.configure_logging(Settings(log_json=True, log_level="INFO"))
        logging.getLogger("workers.test").info("hello %s", "there")
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == ("INFO", "workers.test", "hello there")


HEAVY = ("mcp", "mcp_types", "arq", "starlette", "uvicorn", "prompt_toolkit", "aiohttp", "redis")


@pytest.mark.parametrize("argv", [["ask", "--help"], ["--help"], ["worker", "--help"], ["mcp", "--help"]], ids=" ".join)
def test_help_imports_no_engine(argv):
    """Issue 12: `qbroker ask --help` took 0.9 s, nearly all of it importing every command's engine."""
    probe = (
        "import sys\n"
        "from workers import cli\n"
        "try:\n"
        f"    cli.main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


@pytest.mark.parametrize("command", ["provide", "auto", "ask", "status", "web", "worker", "mcp", "claude-hook"])
def test_every_command_module_imports_light(command):
    """Each command module holds `register()` only; what it runs is imported by `run()`."""
    module = cli.COMMANDS[command]
    probe = f"import sys, {module}; print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_web_logs_json_lines_uvicorn_included(redis_server, namespace):
    """Issue 16: under QBROKER_LOG_JSON uvicorn's start-up and access lines were plain text."""
    import asyncio

    import httpx

    from tests.redis_server import free_port
    from tests.workers.procs import Worker

    port = free_port()
    web = await Worker.start(
        "web", "--port", str(port), "--token", "bot=0123456789abcdef0123",
        url=redis_server.url, namespace=namespace, QBROKER_LOG_JSON="1", QBROKER_LOG_LEVEL="INFO",
        QBROKER_WEB_SECRET="s" * 64,
    )  # fmt: skip
    try:
        await web.expect(r"Uvicorn running on")
        async with httpx.AsyncClient() as client:
            await asyncio.wait_for(client.get(f"http://127.0.0.1:{port}/"), 10)
        await web.expect(r"GET / HTTP")
    finally:
        await web.stop()
    entries = [json.loads(line) for line in web.lines if line.strip()]  # every line is one JSON object
    loggers = {entry["logger"] for entry in entries}
    assert {"uvicorn.error", "uvicorn.access"} <= loggers, loggers
