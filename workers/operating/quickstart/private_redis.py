"""The quickstart's own ``redis-server``: no open default user, one ACL user per role.

Its ACL file is written before the server starts, so no moment exists when a connection without
credentials is served: ``default`` is off, and each role of the namespace (broker/roles.py: asker,
answerer, maintenance) has a user with a generated password, stored in the file as its SHA-256
only. The passwords go to the processes of their roles (``url``), never on a command line (which
every user of the machine can read). Nothing is written to disk (no snapshots, no AOF): the
questions of a private Redis end with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker.roles import ROLES, Role, acl_user

__all__ = ["PrivateRedis", "write_private"]

_STARTUP_S = 10.0
_STOP_S = 5.0

_DEFAULT_OFF = "user default off resetpass resetkeys resetchannels -@all"
"""the default user can neither sign in nor do anything: every connection names its role's user"""


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (0600 from its creation, not chmod-ed after)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)


class PrivateRedis:
    """A ``redis-server`` on ``127.0.0.1:port`` with an ACL file in ``directory``."""

    def __init__(self, binary: str, directory: Path, namespace: str, port: int) -> None:
        self.binary, self.directory, self.namespace, self.port = binary, directory, namespace, port
        self._passwords: dict[Role, str] = {role: secrets.token_urlsafe(24) for role in ROLES}
        self.process: asyncio.subprocess.Process | None = None

    def __repr__(self) -> str:  # the passwords stay out of reprs and logs
        return f"PrivateRedis(address={self.address!r})"

    @property
    def address(self) -> str:
        """The server's URL without credentials: what may be printed."""
        return f"redis://127.0.0.1:{self.port}/0"

    def url(self, role: Role) -> str:
        """The URL ``role``'s processes connect with: its own user and password."""
        return f"redis://{self.namespace}-{role}:{self._passwords[role]}@127.0.0.1:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    async def start(self) -> asyncio.subprocess.Process:
        """Start the server and wait until its maintenance user is answered."""
        self.directory.mkdir(mode=0o700, exist_ok=True)
        acl_file = self.directory / "users.acl"
        users = [acl_user(self.namespace, role, password) for role, password in self._passwords.items()]
        write_private(acl_file, "\n".join([_DEFAULT_OFF, *users]) + "\n")
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--logfile", str(self.log),
            "--aclfile", str(acl_file),
        ]  # fmt: skip
        self.process = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C and a closed terminal's SIGHUP reach quickstart only
            umask=0o077,  # its log and anything else it writes: for its owner only
        )
        return self.process

    async def wait_ready(self) -> bool:
        """True once the server answers its maintenance user; False if it exited or did not within 10 s."""
        assert self.process is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STARTUP_S
        while self.process.returncode is None and loop.time() < deadline:
            client = Redis.from_url(self.url("maintenance"), socket_connect_timeout=1, socket_timeout=1)
            try:
                if await client.ping():
                    return True
            except (RedisError, OSError):
                await asyncio.sleep(0.05)
            finally:
                await client.aclose()
        return False

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), _STOP_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
