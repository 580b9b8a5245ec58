"""The sockets a server listens on: TCP (Nagle off) and a Unix socket no wider than its mode."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import stat

from broker import UserQuestionError
from broker.errors import BAD_REQUEST

__all__ = ["is_loopback", "listen_tcp", "listen_unix"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` listens only to this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_unix(path: str, mode: int) -> socket.socket:
    """A listening Unix socket at ``path`` that only ``mode`` may connect to (never wider, not even briefly)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise UserQuestionError(f"{path} exists and is not a socket: not replacing it", BAD_REQUEST)
        os.unlink(path)  # a previous gateway's socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777)  # bound with no permission at all, then opened to ``mode`` exactly
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def listen_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, port), family=family)
    # Named TCP: asyncio turns Nagle off (TCP_NODELAY) only on accepted sockets whose protocol says so,
    # and create_server leaves it 0; with Nagle on, a reply on a kept-alive connection waited 40 ms
    # for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=listener.detach())
    sock.setblocking(False)
    return sock
