"""``qbroker gateway``: agents ask through it with a bearer token instead of Redis credentials.

``qbroker gateway token new|revoke|list`` manages the tokens file (only SHA-256 digests are
stored; a new token is printed once). The work is in ``workers.asking.gateway.server``, imported only when
the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from workers.settings import Settings, Subparsers
from workers.settings import add_arguments as add_shared_arguments

__all__ = ["register", "run"]

_ENV_TOKENS = "QBROKER_GATEWAY_TOKENS_FILE"
_ENV_ATTEST = "QBROKER_GATEWAY_SIGNING_KEY"


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "gateway",
        help="let agents ask over HTTP or a Unix socket with per-agent tokens, holding no Redis credentials",
        description="Serve the asking side over HTTP (loopback by default; put TLS in a proxy in front) and/or a "
        "Unix socket. Each agent presents its bearer token, which decides its agent id. The gateway asks through "
        "Redis as an asker and verifies every answer. `qbroker gateway token new AGENT` makes a token.",
    )
    env = os.environ
    parser.add_argument(
        "--tokens-file",
        default=env.get(_ENV_TOKENS) or None,
        metavar="FILE",
        help=f"the agents' token digests, one 'AGENT SHA256' a line (env {_ENV_TOKENS}); re-read when it changes",
    )
    parser.add_argument(
        "--host",
        default=env.get("QBROKER_GATEWAY_HOST", "127.0.0.1"),
        help="HTTP address (default 127.0.0.1; beyond loopback only with tokens in the file)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(env.get("QBROKER_GATEWAY_PORT", "8790")),
        help="HTTP port (default 8790; 0 picks a free one, printed at start)",
    )
    parser.add_argument("--no-http", action="store_true", help="serve the Unix socket only")
    parser.add_argument("--socket", metavar="PATH", help="also serve on this Unix socket")
    parser.add_argument(
        "--socket-mode",
        choices=("600", "660"),
        default="600",
        help="who may connect to the socket: its owner (600, default) or its group too (660)",
    )
    parser.add_argument(
        "--attest-key-file",
        default=None,
        metavar="FILE",
        help="the gateway's own secret key (`qbroker keys new`; never the answering key): it attests each ask, so "
        f"pages pinning its public key show the agent id as verified (env {_ENV_ATTEST}_FILE, or the key itself in "
        f"{_ENV_ATTEST})",
    )
    parser.add_argument(
        "--abandon-after",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="withdraw (keyed: detach) an ask nobody has waited on for this long (default 60)",
    )
    parser.add_argument(
        "--unavailable-after",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with Redis unreachable this long, end each waiting ask BROKER_UNAVAILABLE (default 30)",
    )
    commands = parser.add_subparsers(dest="gateway_command", metavar="token", required=False)
    token = commands.add_parser("token", help="make, revoke or list the agents' tokens")
    actions = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    new = actions.add_parser("new", help="make a token for AGENT: printed once, only its digest is kept")
    new.add_argument("agent", metavar="AGENT")
    revoke = actions.add_parser("revoke", help="remove every token of AGENT (counts at its next request)")
    revoke.add_argument("agent", metavar="AGENT")
    actions.add_parser("list", help="the agents that have tokens, and how many")
    for sub in (token, *actions.choices.values()):
        sub.add_argument("--tokens-file", default=argparse.SUPPRESS, metavar="FILE", help="the tokens file")
        add_shared_arguments(sub, suppress=True)
    parser.set_defaults(func=run, loop_factory=_new_loop)


def _say(message: str) -> None:
    print(f"qbroker gateway: {message}", file=sys.stderr, flush=True)


def _tokens(args: argparse.Namespace) -> int:
    from workers.asking.gateway.tokens import TokenFileError, new_token, revoke_tokens, token_agents

    path = args.tokens_file
    try:
        if args.token_command == "new":
            print(new_token(path, args.agent))
            _say(f"the token above is shown once; {path} keeps only its digest")
        elif args.token_command == "revoke":
            removed = revoke_tokens(path, args.agent)
            _say(f"revoked {removed} token{'s' if removed != 1 else ''} of {args.agent}")
            return 0 if removed else 1
        else:
            for agent_id, count in token_agents(path):
                print(f"{agent_id}\t{count}")
    except TokenFileError as error:
        _say(str(error))
        return 2
    return 0


async def run(args: argparse.Namespace) -> int:
    if not args.tokens_file:
        _say(f"give --tokens-file FILE (or {_ENV_TOKENS}): the tokens decide who asks")
        return 2
    if getattr(args, "gateway_command", None) == "token":
        return _tokens(args)

    from broker import Broker, UserQuestionError
    from broker.errors import NO_TRUSTED_KEY
    from workers.asking.gateway.server import GatewaySettings, serve
    from workers.asking.gateway.tokens import TokenFileError
    from workers.exits import EXIT_STATUS

    settings: Settings = args.settings
    if args.no_http and not args.socket:
        _say("--no-http leaves nothing to serve: give --socket PATH")
        return 2
    if not args.unavailable_after > 0:
        _say(f"--unavailable-after must be a positive number of seconds, not {args.unavailable_after}")
        return 2
    gateway = GatewaySettings(
        tokens_file=args.tokens_file,
        host=args.host,
        port=None if args.no_http else args.port,
        socket_path=args.socket,
        socket_mode=int(args.socket_mode, 8),
        abandon_after=args.abandon_after,
    )
    try:
        if not settings.trusted_keys:
            # The gateway is an asker: it never signs (no signing key, even if one is set), it verifies.
            raise UserQuestionError(
                "the gateway verifies answers: give the providers' public keys (--trusted-keys-file FILE or "
                "QBROKER_TRUSTED_KEYS_FILE)",
                NO_TRUSTED_KEY,
            )
        _raise_open_files()
        attest_key = _attest_key(args)
        if attest_key is None:
            _say(f"no gateway key (--attest-key-file or {_ENV_ATTEST}_FILE): answerers see these agent ids as claimed")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        broker = Broker(
            settings.redis_url,
            settings.namespace,
            lease_ttl=settings.lease_ttl,
            trusted_keys=settings.trusted_keys,
            attest_key=attest_key,
            unavailable_after=args.unavailable_after,
        )
        async with broker:
            await serve(gateway, broker, stop, lambda address: _say(f"listening on {address}"))
    except UserQuestionError as error:
        _say(str(error))
        return EXIT_STATUS.get(error.code, 1)
    except TokenFileError as error:
        _say(str(error))
        return 2
    except ValueError as error:  # the gateway key's file cannot be read
        _say(str(error))
        return 2
    except OSError as error:  # the port is taken, the socket's directory is missing, ...
        _say(f"cannot listen: {error}")
        return 1
    return 0


def _raise_open_files() -> None:
    """Lift the soft limit on open files to the hard one: each waiting agent holds a socket here."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:  # e.g. an unlimited hard limit some systems refuse
            _say(f"open files stay limited to {soft}: {error}")
        else:
            _say(f"open files limit raised from {soft} to {hard}")


def _attest_key(args: argparse.Namespace) -> str | None:
    """The gateway key's text: the flag's file, else the environment's file or inline key; None for none."""
    env = os.environ
    path = args.attest_key_file or env.get(f"{_ENV_ATTEST}_FILE") or ""
    if not path:
        return env.get(_ENV_ATTEST, "").strip() or None
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except OSError as error:
        raise ValueError(f"cannot read the gateway key file {path}: {error.strerror}") from None


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (not on Windows), imported only when the gateway runs:
    every ask through the gateway is a dozen turns of the loop, and libuv's cost less than asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
