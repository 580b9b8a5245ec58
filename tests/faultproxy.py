"""A fault-injecting TCP proxy in front of a Redis, for tests of lost replies and bad networks.

    with FaultProxy(server.port) as proxy:
        broker = Broker(proxy.url, ...)
        fired = proxy.drop_next_reply(b"BLMPOP", skip_empty=True)
        ...
        assert fired.wait(5)

The proxy runs its own event loop in a daemon thread, so it serves in-process asyncio tests
and subprocesses alike, and every control below is a thread-safe call that has taken effect
when it returns:

- ``drop_next_reply(*words)``: the next reply to a command whose first words match (the name
  case-insensitively, e.g. ``b"EVALSHA", sha``) is not forwarded; that client connection is
  reset instead: a reply lost with a broken connection, after Redis ran the command.
- ``fail_next_reply(*words, error=...)``: the next reply to a matching command is replaced by an
  error reply (``-ERR ...``); the connection stays open: Redis ran the command, its caller got an error.
- ``reset()``: every open connection is closed with a RST (SO_LINGER 0), both sides.
- ``silence()``: nothing is forwarded either way, but every socket stays open (a half-open
  host); what arrives meanwhile is held and forwarded after ``heal()``.
- ``delay(seconds)``: every byte is forwarded ``seconds`` after it arrived.
- ``refuse()``: new connections are reset at once.
- ``heal()``: undo silence, delay and refuse.
- ``connections``, ``open_connections``, ``commands`` (a Counter by command name): what it saw.

Replies are paired with commands by parsing RESP (2 and 3) in both directions: every reply
answers the oldest unanswered command of its connection; a RESP3 push, or a reply nobody
asked for (pub/sub), is forwarded as is.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

__all__ = ["FaultProxy", "parse_resp"]

T = TypeVar("T")
_KILL = object()  # a queue item: reset the connection here
_FIRED = object()  # a queue item: the rule's error reply went out
_AGGREGATES = {ord(c): c for c in "*~>%|"}


def parse_resp(buf: bytes | bytearray, pos: int = 0) -> tuple[int, Any] | None:
    """One complete RESP value at ``pos``: ``(end, value)``, or None while incomplete.

    A value is ``None`` (null), bytes (a string, an error, a number), or a list (an
    aggregate; a map is its flat key/value list). A RESP3 push comes back as ``("push", list)``,
    an inline command (``PING\\r\\n``) as its words.
    """
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return None
    kind, line, after = buf[pos], bytes(buf[pos + 1 : nl]), nl + 2
    if kind in b"+-:,#(":
        return after, line
    if kind == ord("_"):
        return after, None
    if kind in b"$!=":
        size = int(line)
        if size < 0:
            return after, None
        if len(buf) < after + size + 2:
            return None
        return after + size + 2, bytes(buf[after : after + size])
    if kind in _AGGREGATES:
        count = int(line)
        if count < 0:
            return after, None
        if kind in b"%|":
            count *= 2
        items: list[Any] = []
        for _ in range(count):
            parsed = parse_resp(buf, after)
            if parsed is None:
                return None
            after, item = parsed
            items.append(item)
        return (after, ("push", items)) if kind == ord(">") else (after, items)
    return after, bytes(buf[pos:nl]).split()  # an inline command


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a RST rather than a FIN: the peer sees ECONNRESET."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


class _Rule:
    def __init__(self, words: tuple[bytes, ...], skip_empty: bool, error: bytes | None = None) -> None:
        self.words = words
        self.skip_empty = skip_empty
        self.error = error
        """None: drop the reply and reset the connection; else the error reply sent instead"""
        self.fired = threading.Event()

    def matches(self, command: list[bytes], reply: Any) -> bool:
        if len(command) < len(self.words):
            return False
        if command[0].upper() != self.words[0].upper() or command[1 : len(self.words)] != list(self.words[1:]):
            return False
        return not (self.skip_empty and (reply is None or reply == []))


class _Connection:
    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.asked: collections.deque[list[bytes]] = collections.deque()  # commands awaiting a reply
        self.closed = asyncio.Event()

    def kill(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            _rst(self.client)
            _rst(self.server)

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.client.transport.abort()
            self.server.transport.abort()


class FaultProxy:
    """Listens on a free loopback port and forwards to ``target_host:target_port``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0
        self.commands: collections.Counter[str] = collections.Counter()
        self._open: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._rules: list[_Rule] = []
        self._delay = 0.0
        self._refusing = False
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy", daemon=True)

    # -- lifecycle

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen)
        return self

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            assert self._server is not None and self._flowing is not None
            self._server.close()
            self._refusing = True
            for connection in list(self._open):
                connection.close()
            self._flowing.set()
            # each connection's handler returns once its connection is closed
            await asyncio.gather(*self._handlers, return_exceptions=True)

        self._call(shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (a function or a coroutine function) on the proxy's loop; wait for it."""

        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # -- the controls

    def drop_next_reply(self, *words: bytes | str, skip_empty: bool = False) -> threading.Event:
        """Drop the next reply to a command starting with ``words`` (up to 4) and reset that connection.

        ``skip_empty``: a null or empty reply (a blocking read that timed out) is forwarded
        and does not use the rule up. The returned event is set once the reply was dropped.
        """
        rule = _Rule(tuple(w.encode() if isinstance(w, str) else w for w in words), skip_empty)
        self._call(lambda: self._rules.append(rule))
        return rule.fired

    def fail_next_reply(self, *words: bytes | str, error: str = "ERR injected by the fault proxy") -> threading.Event:
        """Replace the next reply to a command starting with ``words`` by the error reply ``-<error>``.

        The connection stays open and in step (one reply for one command). The returned event is
        set once the error was sent.
        """
        rule = _Rule(tuple(w.encode() if isinstance(w, str) else w for w in words), False, error.encode())
        self._call(lambda: self._rules.append(rule))
        return rule.fired

    def reset(self) -> None:
        """RST every open connection (on both sides); new connections are served."""

        def kill_all() -> None:
            for connection in list(self._open):
                connection.kill()

        self._call(kill_all)

    def silence(self) -> None:
        """Forward nothing either way, keep every socket open; held data flows after heal()."""

        def silence() -> None:
            assert self._flowing is not None
            self._flowing.clear()

        self._call(silence)

    def delay(self, seconds: float) -> None:
        """Forward every byte ``seconds`` after it arrived (from now on)."""
        self._call(lambda: setattr(self, "_delay", seconds))

    def refuse(self) -> None:
        """Reset new connections at once (open ones are left alone)."""
        self._call(lambda: setattr(self, "_refusing", True))

    def heal(self) -> None:
        """Undo silence(), delay() and refuse(); pending drop rules stay."""

        def heal() -> None:
            self._delay = 0.0
            self._refusing = False
            assert self._flowing is not None
            self._flowing.set()

        self._call(heal)

    @property
    def open_connections(self) -> int:
        return int(self._call(lambda: len(self._open)))

    def seen(self, command: bytes | str) -> int:
        """How many commands named ``command`` went through."""
        name = (command.decode() if isinstance(command, bytes) else command).upper()
        return int(self._call(lambda: self.commands[name]))

    # -- forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)
        self.connections += 1
        if self._refusing:
            _rst(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _rst(writer)
            return
        connection = _Connection(writer, up_writer)
        if self._refusing:  # refused (or stopped) while connecting upstream
            connection.kill()
            return
        self._open.add(connection)
        to_server: asyncio.Queue[tuple[float, Any]] = asyncio.Queue()
        to_client: asyncio.Queue[tuple[float, Any]] = asyncio.Queue()
        readers = [
            asyncio.create_task(self._read_commands(connection, reader, to_server)),
            asyncio.create_task(self._read_replies(connection, up_reader, to_client)),
        ]
        # a writer ends when its side closed (after forwarding what was read) or was reset
        ends = [
            asyncio.create_task(self._write(connection, to_server, up_writer)),
            asyncio.create_task(self._write(connection, to_client, writer)),
            asyncio.create_task(connection.closed.wait()),
        ]
        tasks = readers + ends
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            connection.close()
            self._open.discard(connection)

    def _due(self) -> float:
        return self._loop.time() + self._delay

    async def _messages(
        self, reader: asyncio.StreamReader
    ) -> AsyncIterator[tuple[float, bytes, list[tuple[bytes, Any]]]]:
        """Each read from ``reader`` until it closes: when it is due out, its bytes, and the whole RESP messages
        it completes, each with its own bytes (a message cut across reads comes with the read that ends it)."""
        buf = bytearray()
        while data := await self._read(reader):
            due = self._due()
            buf += data
            messages: list[tuple[bytes, Any]] = []
            pos = 0
            while (parsed := parse_resp(buf, pos)) is not None:
                end, message = parsed
                messages.append((bytes(buf[pos:end]), message))
                pos = end
            del buf[:pos]
            yield due, data, messages

    async def _read_commands(
        self, connection: _Connection, reader: asyncio.StreamReader, out: asyncio.Queue[tuple[float, Any]]
    ) -> None:
        async for due, data, commands in self._messages(reader):
            for _, command in commands:
                if isinstance(command, list) and command and all(isinstance(w, bytes) for w in command):
                    connection.asked.append(command[:4])
                    self.commands[command[0].decode(errors="replace").upper()] += 1
            out.put_nowait((due, data))
        out.put_nowait((self._due(), None))  # the client closed: close upstream after the rest

    async def _read_replies(
        self, connection: _Connection, reader: asyncio.StreamReader, out: asyncio.Queue[tuple[float, Any]]
    ) -> None:
        async for due, _, replies in self._messages(reader):
            held = bytearray()  # the replies passed on as they are, sent together
            for raw, reply in replies:
                rule = None
                if not (isinstance(reply, tuple) and reply[:1] == ("push",)) and connection.asked:
                    command = connection.asked.popleft()
                    rule = next((r for r in self._rules if r.matches(command, reply)), None)
                if rule is None:
                    held += raw
                    continue
                self._rules.remove(rule)
                if held:
                    out.put_nowait((due, bytes(held)))
                    held = bytearray()
                if rule.error is None:
                    out.put_nowait((due, (_KILL, rule)))
                    return
                out.put_nowait((due, b"-" + rule.error + b"\r\n"))
                out.put_nowait((due, (_FIRED, rule)))
            if held:
                out.put_nowait((due, bytes(held)))
        out.put_nowait((self._due(), None))

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> bytes:
        try:
            return await reader.read(65536)
        except OSError:
            return b""  # reset: treated as closed

    async def _write(
        self, connection: _Connection, queue: asyncio.Queue[tuple[float, Any]], writer: asyncio.StreamWriter
    ) -> None:
        assert self._flowing is not None
        while True:
            due, item = await queue.get()
            await self._flowing.wait()
            if (wait := due - self._loop.time()) > 0:
                await asyncio.sleep(wait)
            await self._flowing.wait()
            if item is None:
                return
            if isinstance(item, tuple) and item[0] is _KILL:
                connection.kill()
                item[1].fired.set()
                return
            if isinstance(item, tuple) and item[0] is _FIRED:
                item[1].fired.set()
                continue
            writer.write(item)
            await writer.drain()
