"""``qbroker quickstart``: a team's whole set-up in one command, for a first try or a small team.

Starts a private ``redis-server`` (default user off, one user per role) unless a Redis is given
(``--redis-url`` or ``QBROKER_REDIS_URL``), makes the namespace's key pair and a user with a
generated password, runs ``qbroker web``, ``qbroker worker`` and ``qbroker gateway`` (with a
generated token), prints the page's URL, the password and what an asking shell needs (the
gateway and its token), and stops everything on Ctrl-C, SIGTERM or a closed terminal's SIGHUP.
"""

from __future__ import annotations

import argparse
import getpass
import os
from pathlib import Path

from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "quickstart",
        help="start Redis (if none is given), the web page with a generated user, the worker and the gateway",
        description="One command for a team's first try: a private redis-server (one user per role, the default "
        "user off) unless --redis-url / QBROKER_REDIS_URL names one, the namespace's signing keys, a user with a "
        "generated password, `qbroker web`, `qbroker worker` and `qbroker gateway` with a generated token. Prints "
        "the URL, the password and the gateway's export line; Ctrl-C stops everything.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address the page listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="the page's port (default 8080)")
    parser.add_argument(
        "--gateway-port", type=int, default=8790, help="the gateway's port, on 127.0.0.1 (default 8790)"
    )
    parser.add_argument(
        "--redis-port", type=int, default=None, help="the private Redis's port, on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--user", default=_login_name(), help="the user to create (default: your login name, else 'admin')"
    )
    parser.add_argument(
        "--agent", default="agent", metavar="ID", help="the agent id the printed gateway token asks as (default agent)"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the keys, the users file and the logs here (made 0700; kept keys are reused); "
        "default: a private temporary directory removed on exit",
    )
    parser.add_argument("--no-worker", action="store_true", help="do not start `qbroker worker`")
    parser.set_defaults(func=run)


def _login_name() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        return "admin"
    return name if name.isidentifier() else "admin"


async def run(args: argparse.Namespace) -> int:
    from workers.operating.quickstart.stack import TeamPlan, serve

    settings = args.settings
    # A Redis counts as given only when named: the settings' default (localhost:6379) is not a choice.
    given = getattr(args, "redis_url", None) or os.environ.get("QBROKER_REDIS_URL") or None
    plan = TeamPlan(
        redis_url=given and settings.redis_url,
        namespace=settings.namespace,
        host=args.host,
        port=args.port,
        user=args.user,
        directory=args.dir,
        worker=not args.no_worker,
        gateway_port=args.gateway_port,
        redis_port=args.redis_port,
        agent=args.agent,
    )
    return await serve(plan)
