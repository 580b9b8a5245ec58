"""``qbroker web``: serve the page where people answer the namespace's questions."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import secrets
import socket
import sys
from pathlib import Path
from types import FrameType

__all__ = ["register", "run"]

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "web",
        help="serve the web page where people answer questions (a provider with standby)",
        description="Run the web provider: hold the namespace's lease (or stand by) and serve the answer page.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    parser.add_argument("--host", default=env.get("QBROKER_WEB_HOST", "127.0.0.1"), help="address to listen on")
    parser.add_argument("--port", type=int, default=int(env.get("QBROKER_WEB_PORT", "8080")), help="port")
    parser.add_argument(
        "--redis-url",
        default=env.get("QBROKER_REDIS_URL", "redis://localhost:6379/0"),
        help="Redis URL (env QBROKER_REDIS_URL)",
    )
    parser.add_argument(
        "--namespace", default=env.get("QBROKER_NAMESPACE", "default"), help="namespace (env QBROKER_NAMESPACE)"
    )
    parser.add_argument("--name", default=f"web@{socket.gethostname()}", help="provider name shown to others")
    parser.add_argument(
        "--users-file",
        type=Path,
        default=env.get("QBROKER_WEB_USERS") or None,
        help="TOML file with [users] (password hashes) and [tokens] (env QBROKER_WEB_USERS)",
    )
    parser.add_argument(
        "--token", action="append", default=[], metavar="NAME=TOKEN", help="a bearer token (repeatable)"
    )
    parser.add_argument("--secure-cookies", action="store_true", help="mark cookies Secure (serve over HTTPS)")
    parser.add_argument("--lease-ttl", type=float, default=10.0, help="provider lease TTL, seconds")
    parser.add_argument(
        "--hash-password", action="store_true", help="read a password from stdin, print its hash for the users file"
    )


def _log_json(args: argparse.Namespace) -> bool:
    settings = getattr(args, "settings", None)  # absent when run as `python -m workers.web`
    return bool(settings is not None and settings.log_json)


async def run(args: argparse.Namespace) -> int:
    import uvicorn

    from workers.web import ConfigError, WebConfig, create_app, hash_password, load_credentials

    if args.hash_password:
        password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
        print(hash_password(password))
        return 0
    try:
        credentials = load_credentials(args.users_file, args.token)
    except ConfigError as error:
        print(f"qbroker web: {error}", file=sys.stderr)
        return 2
    secret = os.environ.get("QBROKER_WEB_SECRET")
    if not secret:
        log.warning("QBROKER_WEB_SECRET is not set: sessions end when this process stops")
    config = WebConfig(
        redis_url=args.redis_url,
        namespace=args.namespace,
        name=args.name,
        host=args.host,
        port=args.port,
        credentials=credentials,
        secure_cookies=args.secure_cookies,
        lease_ttl=args.lease_ttl,
        secret=secret or secrets.token_hex(32),
    )
    app = create_app(config)
    loop = asyncio.get_running_loop()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Open event streams would hold the shutdown until its timeout: end them first.
            service = getattr(app.state, "service", None)
            if service is not None:
                loop.call_soon_threadsafe(service.end_streams)
            super().handle_exit(sig, frame)

    server = Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="info",
            timeout_graceful_shutdown=3,
            proxy_headers=False,
            server_header=False,
            # Under --log-json / QBROKER_LOG_JSON uvicorn's own lines (start-up, access log) go
            # through the CLI's JSON handler too, instead of uvicorn's plain-text formatters.
            log_config=None if _log_json(args) else uvicorn.config.LOGGING_CONFIG,
        )
    )
    await server.serve()
    return 0
