"""The engine of ``qbroker ask``: build the request from flags, ask, print the answer or the error."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from redis.exceptions import RedisError

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PlanReviewIntent,
    UserQuestionError,
)
from broker.errors import BAD_REQUEST, BROKER_UNAVAILABLE
from broker.types import decode_request, encode
from workers.exits import EXIT_DETACHED, EXIT_INTERNAL, EXIT_OK, EXIT_STATUS
from workers.settings import Settings

if TYPE_CHECKING:  # aiohttp loads only for an ask through the gateway
    from workers.asking.gateway.client import GatewayClient

__all__ = ["ask", "build_request"]


def _fail(error: UserQuestionError) -> int:
    sys.stderr.buffer.write(encode(error.to_payload()) + b"\n")
    sys.stderr.flush()
    return EXIT_STATUS.get(error.code, EXIT_INTERNAL)


def _read(path: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as error:
        raise UserQuestionError(f"cannot read {path}: {error.strerror}", BAD_REQUEST) from error


def build_request(args: argparse.Namespace) -> AskUserQuestionRequest:
    """The request from ``--request`` or from the question flags."""
    if args.request is not None:
        if args.question is not None:
            raise UserQuestionError("give either --request or --question, not both", BAD_REQUEST)
        try:
            request = decode_request(_read(args.request))
        except msgspec.DecodeError as error:
            raise UserQuestionError(f"the request is not valid: {error}", BAD_REQUEST) from error
    elif args.question is not None:
        options = []
        for text in args.option:
            label, _, description = text.partition("=")
            options.append(AskUserQuestionOption(label=label, description=description or None))
        item = AskUserQuestionItem(
            id=args.id,
            question=args.question,
            header=args.header,
            detail=_read(args.detail_file).decode() if args.detail_file else None,
            options=tuple(options) or None,
            multi_select=args.multi,
            intent=PlanReviewIntent(approve=args.plan_review) if args.plan_review else None,
        )
        request = AskUserQuestionRequest(questions=(item,))
    else:
        raise UserQuestionError("nothing to ask: give --question or --request", BAD_REQUEST)
    if args.agent is not None:
        request = msgspec.structs.replace(request, agent=args.agent)
    if getattr(args, "priority", None) is not None:
        request = msgspec.structs.replace(request, priority=args.priority)
    return request


@contextlib.contextmanager
def _abort_on_signals(abort: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, abort.set)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


class _Detached(Exception):
    """A keyed ask was interrupted: it stays pending for its detach grace."""


async def _until_detached(asking: Coroutine[Any, Any, AskUserQuestionAnswer], detach: asyncio.Event) -> Any:
    """Await the keyed ask; a signal cancels it, which detaches it (the broker's rule)."""
    task = asyncio.ensure_future(asking)
    signalled = asyncio.ensure_future(detach.wait())
    try:
        await asyncio.wait({task, signalled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        return await task  # an answer that won the race is still given
    except asyncio.CancelledError:
        raise _Detached from None


@contextlib.asynccontextmanager
async def _as_agent(broker: Broker, agent_id: str | None, owner: str | None, restart: bool) -> AsyncIterator[None]:
    if agent_id is None:
        yield
        return
    async with broker.agent(agent_id, owner=owner, restart=restart):
        yield


@contextlib.asynccontextmanager
async def _asker(
    settings: Settings, agent_id: str | None, owner: str | None, restart: bool
) -> AsyncIterator[Broker | GatewayClient]:
    """What asks: the gateway (its token decides the agent), or a broker on Redis."""
    if settings.gateway_url:
        from workers.asking.gateway.client import GatewayClient

        if owner is not None:
            raise UserQuestionError("--owner cannot be used with --gateway: the token decides the agent", BAD_REQUEST)
        if restart:
            raise UserQuestionError("--restart cannot be used with --gateway: the gateway holds the agent", BAD_REQUEST)
        async with GatewayClient(settings.gateway_url, settings.gateway_token) as gateway:
            yield gateway
        return
    async with settings.broker() as broker, _as_agent(broker, agent_id, owner, restart):
        yield broker


async def ask(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    if args.owner is not None and args.agent is None:
        return _fail(UserQuestionError("--owner needs --agent", BAD_REQUEST))
    restart = bool(getattr(args, "restart", False))
    if restart and args.agent is None:
        return _fail(UserQuestionError("--restart needs --agent", BAD_REQUEST))
    key = getattr(args, "key", None)
    grace = getattr(args, "detach_grace", None)
    abort = asyncio.Event()
    detach = asyncio.Event()
    # A keyed question outlives this command: a signal detaches from it instead of withdrawing it.
    with _abort_on_signals(detach if key is not None else abort):
        try:
            request = build_request(args)
            async with _asker(settings, args.agent, args.owner, restart) as broker:
                try:
                    remember, coalesce = not args.no_remember, not getattr(args, "no_coalesce", False)
                    if key is None:
                        answer = await broker.ask(
                            request, abort=abort, timeout=args.timeout, remember=remember, coalesce=coalesce
                        )
                    else:
                        asking = broker.ask(
                            request,
                            timeout=args.timeout,
                            key=key,
                            detach_grace=grace,
                            remember=remember,
                            coalesce=coalesce,
                        )
                        answer = await _until_detached(asking, detach)
                except _Detached:
                    sys.stderr.write(
                        f"detached: the question stays pending; run this command again with --key {key}"
                        " to get its answer\n"
                    )
                    return EXIT_DETACHED
                except UserQuestionError as error:
                    return _fail(error)
                # Out before the broker closes: a keyed answer is collected the moment it is returned,
                # so the caller must have it even if this process is killed while closing.
                sys.stdout.buffer.write(encode(answer) + b"\n")
                sys.stdout.flush()
                # The same answer, but nobody was asked now: say so aside (a gateway does not tell; its answer is
                # the gateway's verdict).
                if isinstance(broker, Broker) and broker.remembered_answers:
                    setters = ", ".join(broker.last_remembered_by) or "someone"
                    sys.stderr.write(
                        f"answered by a remembered decision set by {setters} (nobody was asked now;"
                        " `qbroker decisions list` shows it, `revoke ID` makes the next ask go to a human)\n"
                    )
        except UserQuestionError as error:
            return _fail(error)
        except (OSError, RedisError) as error:  # unreachable, refused AUTH, ...
            return _fail(UserQuestionError(f"Redis is unavailable: {error}", BROKER_UNAVAILABLE))
    return EXIT_OK
