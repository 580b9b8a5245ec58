"""``qbroker keys``: the key pair that signs a namespace's answers (docs/security.md).

``new`` writes ``PREFIX.key`` (the secret, mode 0600: for providers only) and ``PREFIX.pub``
(the public key: for every asker), and prints the public key; ``public`` prints the public key
of a secret key file (to add it to the askers' trusted keys before rotating to it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from workers.settings import Subparsers

__all__ = ["register", "run"]


def register(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "keys",
        help="make the key pair that signs answers (providers) and is trusted by askers",
        description="Answers are signed by the answering side and checked by askers against the public keys "
        "they trust: an asking agent's own Redis credentials cannot forge one. See docs/security.md.",
    )
    commands = parser.add_subparsers(dest="keys_command", metavar="new|public", required=True)
    new = commands.add_parser(
        "new",
        help="write PREFIX.key (secret, 0600) and PREFIX.pub; print the public key",
    )
    new.add_argument("prefix", metavar="PREFIX", help="path prefix of the two files, e.g. keys/team-a")
    new.add_argument("--force", action="store_true", help="replace existing files")
    new.add_argument(
        "--gateway",
        action="store_true",
        help="a gateway's attesting key: its .pub goes to the answerers (--gateway-keys-file), never to askers",
    )
    public = commands.add_parser("public", help="print the public key of a secret key file")
    public.add_argument("key_file", metavar="FILE", help="a secret key file written by `qbroker keys new`")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from broker.errors import UserQuestionError
    from broker.signing import SigningKey

    if args.keys_command == "public":
        try:
            key = SigningKey.from_text(Path(args.key_file).read_text(encoding="utf-8"))
        except (OSError, UserQuestionError) as error:
            print(f"qbroker keys public: {error}", file=sys.stderr)
            return 2
        print(key.public_text)
        return 0
    secret, public = Path(f"{args.prefix}.key"), Path(f"{args.prefix}.pub")
    if not args.force and (secret.exists() or public.exists()):
        print(f"qbroker keys new: {secret} or {public} exists (--force replaces them)", file=sys.stderr)
        return 2
    key = SigningKey.generate()
    secret.parent.mkdir(parents=True, exist_ok=True)
    # Created 0600 from the start: the secret is never readable by others, not even for a moment.
    descriptor = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(key.to_text() + "\n")
    os.chmod(secret, 0o600)  # --force over a file that had looser bits
    public.write_text(key.public_text + "\n", encoding="utf-8")
    print(key.public_text)
    if args.gateway:
        # Never an asker's trusted key: a key that may attest asks must not be able to approve them.
        print(
            f"secret: {secret} (the gateway only: qbroker gateway --attest-key-file {secret})\n"
            f"public: {public} (answerers and status: --gateway-keys-file {public}; never an asker's trusted key)",
            file=sys.stderr,
        )
    else:
        print(
            f"secret: {secret} (answerers only: --signing-key-file {secret} / QBROKER_SIGNING_KEY_FILE)\n"
            f"public: {public} (askers: --trusted-keys-file {public} / QBROKER_TRUSTED_KEYS_FILE)\n"
            "a gateway's attesting key is another pair: qbroker keys new PREFIX --gateway",
            file=sys.stderr,
        )
    return 0
