"""``qbroker acl``: one Redis user per role of a namespace (asker, answerer, maintenance).

Prints ``user`` lines for redis.conf or an aclfile (passwords stored as SHA-256 digests) and, as
comments, each role's ``QBROKER_REDIS_URL`` with its new password: give each to its processes
only (docs/security.md).
"""

from __future__ import annotations

import argparse
import secrets
import sys
from urllib.parse import quote, urlsplit, urlunsplit

from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "acl",
        help="print the Redis ACL users of a namespace's roles (asker, answerer, maintenance)",
        description="Print one Redis ACL `user` line per role of the namespace, each with a new random "
        "password (stored hashed), and each role's Redis URL as a comment. The asker's user cannot write "
        "the lease, the remembered decisions or the web's sessions; see docs/security.md.",
    )
    parser.add_argument(
        "--role",
        action="append",
        choices=("asker", "answerer", "maintenance"),
        help="only this role (repeatable; default: all three)",
    )
    parser.add_argument(
        "--host-url",
        metavar="URL",
        default="redis://127.0.0.1:6379/0",
        help="the Redis the URLs in the comments point at (default redis://127.0.0.1:6379/0)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from broker import UserQuestionError
    from broker.roles import ROLES, acl_user

    namespace = args.settings.namespace if getattr(args, "settings", None) else "default"
    parts = urlsplit(args.host_url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        print(f"qbroker acl: --host-url {args.host_url!r} is not a redis:// or rediss:// URL", file=sys.stderr)
        return 2
    lines: list[str] = []
    for role in args.role or ROLES:
        password = secrets.token_urlsafe(24)
        try:
            user = acl_user(namespace, role, password)
        except UserQuestionError as error:
            print(f"qbroker acl: {error}", file=sys.stderr)
            return 2
        netloc = f"{quote(f'{namespace}-{role}', safe='')}:{password}@{parts.hostname}"
        if parts.port:
            netloc += f":{parts.port}"
        url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
        lines += [f"# {role}: QBROKER_REDIS_URL={url}", user]
    print("\n".join(lines))
    return 0
