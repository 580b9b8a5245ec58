"""``qbroker web``: serve the page where people answer the namespace's questions.

``qbroker web sessions list|revoke`` shows and ends the signed-in sessions (kept in Redis).
The shared flags (``--redis-url``, ``-n/--namespace``, ``--lease-ttl``) come from
``workers.settings``, before or after ``web``, like every sub-command.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import getpass
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from workers.answering.options import add_policy_arguments
from workers.settings import Settings, Subparsers
from workers.settings import add_arguments as add_shared_arguments

if TYPE_CHECKING:
    from workers.answering.slack.config import SlackConfig
    from workers.answering.web.config import WebConfig
    from workers.answering.web.users import UsersFile

__all__ = ["add_arguments", "register", "run"]

log = logging.getLogger(__name__)


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "web",
        help="serve the web page where people answer questions (a provider with standby)",
        description="Run the web provider: hold the namespace's lease (or stand by) and serve the answer page. "
        "`qbroker web sessions list|revoke` manages signed-in sessions.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ
    parser.add_argument("--host", default=env.get("QBROKER_WEB_HOST", "127.0.0.1"), help="address to listen on")
    parser.add_argument("--port", type=int, default=int(env.get("QBROKER_WEB_PORT", "8080")), help="port")
    parser.add_argument("--name", default=f"web@{socket.gethostname()}", help="provider name shown to others")
    add_policy_arguments(
        parser,
        policy_help="TOML file of quorum and routing policies, groups in the users file's [groups]",
        users_help="TOML file with [users] (password hashes) and [tokens]",
    )
    parser.add_argument(
        "--slack-config",
        type=Path,
        default=env.get("QBROKER_SLACK_CONFIG") or None,
        help="TOML file of Slack channels: post each card to Slack and take answers there too, users mapped by "
        "the users file's [slack]; secrets in QBROKER_SLACK_BOT_TOKEN and QBROKER_SLACK_SIGNING_SECRET "
        "(or QBROKER_SLACK_APP_TOKEN with socket_mode = true) "
        "(docs/slack.md; env QBROKER_SLACK_CONFIG)",
    )
    parser.add_argument(
        "--token", action="append", default=[], metavar="NAME=TOKEN", help="a bearer token (repeatable)"
    )
    parser.add_argument(
        "--allow-no-users",
        action="store_true",
        help="start even with no users and no tokens (nobody can sign in, yet the page holds the lease); "
        "without it such a page refuses to start (NO_USERS)",
    )
    parser.add_argument("--secure-cookies", action="store_true", help="mark cookies Secure (serve over HTTPS)")
    parser.add_argument(
        "--public-url",
        default=env.get("QBROKER_WEB_PUBLIC_URL", ""),
        metavar="URL",
        help="where people reach this page; a standby server's page links to the active one's "
        "(env QBROKER_WEB_PUBLIC_URL)",
    )
    parser.add_argument(
        "--trusted-proxy",
        action="append",
        default=[p for p in env.get("QBROKER_WEB_TRUSTED_PROXIES", "").split(",") if p.strip()],
        metavar="ADDRESS[/BITS]",
        help="a reverse proxy whose X-Forwarded-For names the client (repeatable; env "
        "QBROKER_WEB_TRUSTED_PROXIES, comma-separated); without it the header is ignored",
    )
    parser.add_argument(
        "--serve",
        action="append",
        default=[n for n in env.get("QBROKER_WEB_NAMESPACES", "").split(",") if n.strip()],
        metavar="NS",
        help="also provide for this namespace, on the same page (repeatable; env QBROKER_WEB_NAMESPACES, "
        "comma-separated); -n names the primary one, which keeps the sessions. [namespaces] in the users "
        "file says who may answer where",
    )
    parser.add_argument(
        "--page-window",
        type=int,
        default=100,
        metavar="N",
        help="a page is sent the first N cards of each namespace and keeps N on screen; the rest are "
        'counted ("N more waiting") and fetched a page at a time (default 100)',
    )
    parser.add_argument(
        "--handover-grace",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="Take over asks the holder to hand the lease here; a question open there gets this long to finish, "
        "then it is handed over unanswered (default 15)",
    )
    parser.add_argument(
        "--session-hours", type=float, default=12.0, help="a sign-in lasts this long (sessions live in Redis)"
    )
    parser.add_argument(
        "--hash-password", action="store_true", help="read a password from stdin, print its hash for the users file"
    )
    _add_sessions_arguments(parser)


def _add_sessions_arguments(parser: argparse.ArgumentParser) -> None:
    """``qbroker web sessions list|revoke``: the signed-in sessions of the namespace."""
    commands = parser.add_subparsers(dest="web_command", metavar="sessions", required=False)
    sessions = commands.add_parser("sessions", help="list or revoke signed-in sessions")
    actions = sessions.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="who is signed in, from where, until when")
    revoke = actions.add_parser("revoke", help="end sessions at once (their pages must sign in again)")
    revoke.add_argument("ids", nargs="*", metavar="ID", help="session ids from `sessions list` (6+ characters)")
    revoke.add_argument("--user", help="every session of this user")
    revoke.add_argument("--all", action="store_true", help="every session of the namespace")
    for sub in (sessions, listing, revoke):
        add_shared_arguments(sub, suppress=True)


def _settings(args: argparse.Namespace) -> Settings:
    settings = getattr(args, "settings", None)
    return settings if isinstance(settings, Settings) else Settings.build(args)


def _log_json(args: argparse.Namespace) -> bool:
    settings = getattr(args, "settings", None)  # absent when run as `python -m workers.answering.web`
    return bool(settings is not None and settings.log_json)


async def run(args: argparse.Namespace) -> int:
    from broker import Broker, UserQuestionError, load_policies
    from workers.answering.web.config import ConfigError, CredentialSource, WebConfig, hash_password, load_credentials
    from workers.answering.web.render import safe_url
    from workers.answering.web.throttle import parse_networks
    from workers.answering.web.users import UsersFile

    if args.hash_password:
        return _print_hash(hash_password)
    settings = _settings(args)
    if os.environ.get("QBROKER_WEB_SECRET"):
        log.warning("QBROKER_WEB_SECRET is no longer used: sessions live in Redis (qbroker web sessions list)")
    if getattr(args, "web_command", None) == "sessions":
        return await _sessions(args, settings)
    try:
        users = (
            None
            if args.users_file is None
            else UsersFile(args.users_file, args.token, slack=bool(getattr(args, "slack_config", None)))
        )
        credentials: CredentialSource = users or load_credentials(None, args.token)
        policies = load_policies(args.policy_file, groups=credentials.current().groups)
        if users is not None:  # the users file's groups as they are at each vote, the policy file's as read now
            policies = dataclasses.replace(policies, groups=users.groups(_policy_groups(args.policy_file)))
        proxies = parse_networks(args.trusted_proxy)
        slack = _slack(args, users)
        if not 1 <= args.page_window <= 1000:
            raise ConfigError(f"--page-window {args.page_window} is not 1 to 1000")
        if args.public_url and not safe_url(args.public_url):
            raise ConfigError(f"--public-url {args.public_url!r} is not an absolute http(s) URL")
        also_serve = tuple(namespace.strip() for namespace in args.serve)
        for namespace in also_serve:
            Broker(settings.redis_url, namespace)  # refuses a malformed namespace name; connects to nothing
    except (ConfigError, ValueError, UserQuestionError) as error:  # PolicyError is a ValueError
        print(f"qbroker web: {error}", file=sys.stderr)
        return 2
    if not credentials.current() and not getattr(args, "allow_no_users", False):
        # Nobody could sign in, yet it would take the namespace's lease from (or before) a page people use.
        print(
            "qbroker web: NO_USERS: no users and no tokens, so nobody could sign in: give --users-file FILE"
            " (env QBROKER_WEB_USERS) or --token NAME=TOKEN, or --allow-no-users to start anyway",
            file=sys.stderr,
        )
        return 2
    refused = _signing_key_refused(settings)
    if refused is not None:
        return refused
    config = WebConfig(
        redis_url=settings.redis_url,
        namespace=settings.namespace,
        also_serve=also_serve,
        name=args.name,
        host=args.host,
        port=args.port,
        credentials=credentials,
        secure_cookies=args.secure_cookies,
        lease_ttl=settings.lease_ttl,
        session_max_age=args.session_hours * 3600,
        trusted_proxies=proxies,
        public_url=args.public_url,
        signing_key=settings.signing_key,
        gateway_keys=settings.gateway_keys,
        policies=policies,
        slack=slack,
        page_window=args.page_window,
        handover_grace=args.handover_grace,
    )
    return await _serve(config, log_json=_log_json(args))


def _print_hash(hash_password: Callable[[str], str]) -> int:
    """``--hash-password``: a password read from the terminal (or one line of stdin), hashed for the users file."""
    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password.strip():
        print("qbroker web: the password is empty: nothing to hash (type one, or pipe one line)", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


def _signing_key_refused(settings: Settings) -> int | None:
    """The exit status when the page has no usable signing key (it answers, and answers are signed), else None."""
    from broker import UserQuestionError
    from broker.signing import SigningKey
    from workers.exits import EXIT_STATUS

    if not settings.signing_key:
        print(
            "qbroker web: NO_SIGNING_KEY: the page answers, and answers are signed: give it the namespace's key"
            " (--signing-key-file FILE or QBROKER_SIGNING_KEY_FILE; make one with `qbroker keys new`)",
            file=sys.stderr,
        )
        return EXIT_STATUS["NO_SIGNING_KEY"]
    try:
        SigningKey.from_text(settings.signing_key)
    except UserQuestionError as error:
        print(f"qbroker web: {error}", file=sys.stderr)
        return 2
    return None


async def _serve(config: WebConfig, *, log_json: bool) -> int:
    import uvicorn

    from workers.answering.web.app import create_app

    app = create_app(config)
    loop = asyncio.get_running_loop()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # The lease first (a standby takes over at once), then the open event streams, which would hold the
            # shutdown until its timeout.
            for service in getattr(app.state, "services", {}).values():
                loop.call_soon_threadsafe(service.let_go)
                loop.call_soon_threadsafe(service.end_streams)
            super().handle_exit(sig, frame)

    server = Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="info",
            timeout_graceful_shutdown=3,
            proxy_headers=False,  # X-Forwarded-For is read only from --trusted-proxy peers
            server_header=False,
            ws="none",  # the page's events stream over HTTP; a WebSocket library took 10% of a start's CPU to load
            # Under --log-json / QBROKER_LOG_JSON uvicorn's own lines (start-up, access log) go
            # through the CLI's JSON handler too, instead of uvicorn's plain-text formatters.
            log_config=None if log_json else uvicorn.config.LOGGING_CONFIG,
        )
    )
    await server.serve()
    return 0


async def _sessions(args: argparse.Namespace, settings: Settings) -> int:
    from workers.answering.web.keys import WebKeys
    from workers.answering.web.sessions import SessionStore

    async with settings.broker() as broker:
        store = SessionStore(broker.commands.call, WebKeys(settings.namespace), max_age=0)
        if args.sessions_command == "list":
            sessions = await store.list()
            if not sessions:
                print(f"no sessions in namespace {settings.namespace}")
            for s in sessions:
                since = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created_ms / 1000))
                left = f"{s.expires_in_s / 3600:.1f} h left"
                print(f"{s.id}  {s.user:<16} since {since}  {left:<12} {s.address or '-':<16} {s.agent}")
            return 0
        if not (args.ids or args.user or args.all):
            print("qbroker web sessions revoke: name session ids, --user USER or --all", file=sys.stderr)
            return 2
        ended = await store.revoke(ids=tuple(args.ids), user=args.user, everyone=args.all)
        print(f"revoked {ended} session{'s' if ended != 1 else ''}")
        return 0 if ended or args.all else 1


def _slack(args: argparse.Namespace, users: UsersFile | None) -> SlackConfig | None:
    """The Slack face's settings, its secrets read from the environment here, at the edge; who each
    Slack user is from the users file as it is at each click."""
    from workers.answering.slack.config import load_slack_config

    if getattr(args, "slack_config", None) is None:
        return None
    from workers.answering.web.config import ConfigError

    try:  # an optional extra: the page runs without it
        import slack_sdk  # noqa: F401
    except ImportError:
        raise ConfigError("--slack-config needs the Slack SDK: pip install 'question-broker[slack]'") from None
    return load_slack_config(
        args.slack_config,
        args.users_file,
        bot_token=os.environ.get("QBROKER_SLACK_BOT_TOKEN", ""),
        signing_secret=os.environ.get("QBROKER_SLACK_SIGNING_SECRET", ""),
        app_token=os.environ.get("QBROKER_SLACK_APP_TOKEN", ""),
        users=None if users is None else users.slack_users(),
    )


def _policy_groups(policy_file: Path | None) -> dict[str, frozenset[str]]:
    """``[groups]`` of the policy file itself (they win over the users file's, as ``load_policies`` merges them)."""
    import tomllib

    from broker.answering.quorum import load_groups

    if policy_file is None:
        return {}
    return load_groups(tomllib.loads(policy_file.read_text()), str(policy_file))  # load_policies read it just now
