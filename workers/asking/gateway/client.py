"""Asking through ``qbroker gateway``: what ``qbroker ask --gateway`` and ``claude-hook`` use.

The caller holds the gateway's URL (``http://...`` or ``unix:/path/to.sock``) and its bearer token,
nothing else. The gateway verified the answer against the providers' keys before handing it on; the
client trusts the gateway (loopback, its socket's permissions, or TLS in front of it).

A gateway that is away for a moment (restarted, upgraded) does not fail an ask at once: a call that
could not reach it is tried again, with backoff, within the ask's own bound (its timeout) and at most
``reconnect_for`` seconds from the first failure; then the ask ends ``BROKER_UNAVAILABLE`` with the
reason in words. A call is tried again only where a repeat is the same call: one that never reached the
gateway, a poll, a withdrawal, a keyed start (a re-attach). A restarted gateway no longer knows the asks
of the one before: a keyed ask starts again with its key and re-attaches to its question in Redis; an
unkeyed one ended with that gateway (its question is withdrawn), so it ends here, saying to ask again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Final, Unpack

import aiohttp
import msgspec

from broker import AskUserQuestionAnswer, AskUserQuestionRequest, UserQuestionError
from broker.asking.options import AskOptions
from broker.backoff import Backoff
from broker.errors import ASK_ABORTED, BAD_REQUEST, BROKER_UNAVAILABLE, UNKNOWN_ASK, ErrorPayload
from broker.types import convert_answer

__all__ = ["GatewayClient"]

log = logging.getLogger(__name__)

_JSON_BODY: Final = {"content-type": "application/json"}
_POLL: Final = 25.0
"""seconds one long poll asks the gateway to wait (under common proxies' idle timeouts)"""
RECONNECT_FOR: Final = 30.0
"""seconds a call keeps trying to reach a gateway that is away (never past the ask's own timeout)"""


def _in_words(error: BaseException) -> str:
    """Why a call did not get through, for a person (aiohttp's reprs name connection keys and classes)."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return error.os_error.strerror or str(error.os_error) or "the connection was refused"
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "it closed the connection before replying"
    if isinstance(error, TimeoutError | aiohttp.ServerTimeoutError):
        return "it did not reply in time"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


class GatewayAskOptions(AskOptions, total=False):
    """``Broker.ask``'s options, and the texts the questions name as attachments."""

    attachments: Sequence[str]


_OPTIONS = GatewayAskOptions.__optional_keys__
_WIRE_NAMES = (("timeout", "timeout"), ("key", "key"), ("detach_grace", "detachGrace"))


def _ask_body(request: AskUserQuestionRequest, options: GatewayAskOptions) -> dict[str, Any]:
    """The JSON body that starts an ask at the gateway: the request and the options that are not their default."""
    unknown = options.keys() - _OPTIONS
    if unknown:
        raise TypeError(f"ask() got an unexpected keyword argument {min(unknown)!r}")
    body: dict[str, Any] = {"request": request}
    if not options.get("remember", True):
        body["remember"] = False
    if not options.get("coalesce", True):
        body["coalesce"] = False
    attachments = options.get("attachments", ())
    if attachments:
        body["attachments"] = list(attachments)
    for name, wire in _WIRE_NAMES:
        value = options.get(name)
        if value is not None:
            body[wire] = value
    return body


class GatewayClient:
    """One agent's connection to a gateway; an async context manager."""

    def __init__(self, url: str, token: str, *, reconnect_for: float = RECONNECT_FOR) -> None:
        if not token:
            raise UserQuestionError("asking through the gateway needs its token (QBROKER_GATEWAY_TOKEN)", BAD_REQUEST)
        self._unix = url.removeprefix("unix:") if url.startswith("unix:") else None
        if self._unix is None and not url.startswith(("http://", "https://")):
            raise UserQuestionError(f"gateway URL {url!r} must be http(s)://... or unix:/path", BAD_REQUEST)
        self._base = "http://gateway" if self._unix is not None else url.rstrip("/")
        self._where = url
        self._token = token
        self._reconnect_for = reconnect_for
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # the token stays out of reprs and logs
        return f"GatewayClient(url={self._unix or self._base!r})"

    async def __aenter__(self) -> GatewayClient:
        connector = aiohttp.UnixConnector(path=self._unix) if self._unix is not None else None
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers={"authorization": f"Bearer {self._token}"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=_POLL + 30),
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self, method: str, path: str, *, deadline: float, repeatable: bool = True, **options: Any
    ) -> dict[str, Any]:
        """One call, tried again while the gateway cannot be reached (see the module's docstring).

        ``repeatable``: sending it again is the same call even if the first reached the gateway. A reply
        carrying ``error`` raises it as the coded error it is.
        """
        assert self._session is not None, "use `async with GatewayClient(...)`"
        loop = asyncio.get_running_loop()
        backoff, failing_since = Backoff(first=0.1, cap=1.0), None
        while True:
            try:
                async with self._session.request(method, self._base + path, **options) as reply:
                    raw = await reply.read()
                break
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                now = loop.time()
                failing_since = now if failing_since is None else failing_since
                delay = backoff.next()
                # A connection never made sent nothing: trying again cannot start a second ask.
                again = repeatable or isinstance(error, aiohttp.ClientConnectorError)
                if not again or now + delay > min(deadline, failing_since + self._reconnect_for):
                    tried = f" (tried for {now - failing_since:.0f} s)" if now - failing_since >= 1 else ""
                    raise UserQuestionError(
                        f"the gateway at {self._where} is unreachable: {_in_words(error)}{tried}", BROKER_UNAVAILABLE
                    ) from error
                await asyncio.sleep(delay)
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError as error:
            raise UserQuestionError(f"the gateway answered {reply.status} without JSON", BROKER_UNAVAILABLE) from error
        if not isinstance(body, dict):
            raise UserQuestionError(f"the gateway answered {reply.status} with no object", BROKER_UNAVAILABLE)
        if "error" in body:
            raise UserQuestionError.from_payload(msgspec.convert(body["error"], ErrorPayload))
        return body

    async def ask(self, request: AskUserQuestionRequest, **options: Unpack[GatewayAskOptions]) -> AskUserQuestionAnswer:
        """Ask and wait for the outcome, as ``Broker.ask`` does (its options); setting ``abort`` withdraws the question.

        ``attachments``: the texts the request's questions name as attachments, kept by the gateway
        (``Broker.attach``) before it asks. Cancelling the call leaves the ask at the gateway: a keyed
        ask not yet answered is picked up again by asking with the same key; the gateway withdraws (or,
        keyed, detaches) an ask nobody waits on.
        """
        abort, timeout, key = options.get("abort"), options.get("timeout"), options.get("key")
        # Started without waiting: the ask's id comes back at once, so an abort can withdraw it at once.
        body = _ask_body(request, options)
        if abort is not None and abort.is_set():
            raise UserQuestionError("the ask was aborted before it started", ASK_ABORTED)
        deadline = asyncio.get_running_loop().time() + (timeout if timeout is not None else float("inf"))
        # Encoded by msgspec (the request Struct in its wire form), not by aiohttp's json.dumps.
        encoded = msgspec.json.encode(body)

        def start() -> Awaitable[dict[str, Any]]:
            # Keyed, a second start is a re-attach to the same ask; unkeyed, it could be a second question.
            return self._call(
                "POST", "/v1/asks", deadline=deadline, repeatable=key is not None, data=encoded, headers=_JSON_BODY
            )

        outcome = await self._until(start(), abort, None)
        while outcome.get("state") == "pending":
            poll = self._call("GET", f"/v1/asks/{outcome['id']}", deadline=deadline, params={"wait": str(_POLL)})
            try:
                outcome = await self._until(poll, abort, outcome["id"])
            except UserQuestionError as error:
                if error.code != UNKNOWN_ASK:
                    raise
                # The gateway restarted: the one before took its in-memory asks with it.
                if key is None:
                    raise UserQuestionError(
                        "the gateway restarted and its unkeyed asks ended with it (the question was withdrawn): "
                        "ask again",
                        BROKER_UNAVAILABLE,
                    ) from error
                outcome = await self._until(start(), abort, None)  # re-attaches to the question in Redis
        if outcome.get("state") != "answered":
            state = outcome.get("state")
            raise UserQuestionError(f"the gateway answered an ask in state {state!r}", BROKER_UNAVAILABLE)
        try:
            return convert_answer(outcome["answer"])
        except (KeyError, msgspec.ValidationError) as error:
            raise UserQuestionError(f"the gateway's answer is malformed: {error}", BROKER_UNAVAILABLE) from error

    async def _until(
        self, call: Awaitable[dict[str, Any]], abort: asyncio.Event | None, ask_id: str | None
    ) -> dict[str, Any]:
        """Await ``call``; if ``abort`` is set first, withdraw the ask (once its id is known)."""
        work: asyncio.Future[dict[str, Any]] = asyncio.ensure_future(call)
        if abort is None:
            return await work
        aborted: asyncio.Future[Any] = asyncio.ensure_future(abort.wait())
        try:
            await asyncio.wait({work, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if not abort.is_set() or (work.done() and not work.exception() and work.result().get("state") != "pending"):
            return work.result()  # an outcome that came with the abort still stands
        if ask_id is None:  # the start is in flight: its reply names the ask to withdraw
            with contextlib.suppress(UserQuestionError):
                ask_id = (await work).get("id")
        else:
            work.cancel()
        if ask_id is not None:
            with contextlib.suppress(UserQuestionError):
                await self._call("DELETE", f"/v1/asks/{ask_id}", deadline=asyncio.get_running_loop().time() + 5.0)
        raise UserQuestionError("the ask was aborted", ASK_ABORTED)
