"""``qbroker auto --rules FILE``: an automatic provider for pipelines, tests and benchmarks.

It holds the namespace's lease (or stands by until the holder goes) and answers each
request by the first matching rule (see ``workers.rules``). When it loses the lease
(it paused past its TTL, say) its late answers are refused by Redis; it says so and
stands by again, or exits with ``--exit-on-lease-loss``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from broker import Broker, PendingRequest, Provider, UserQuestionError
from broker.errors import BAD_ANSWER, DUPLICATE_PROVIDER, LEASE_LOST, NOT_PENDING

from .._redis import Backoff, describe, redis_trouble
from ..rules import Decision, Rules, RulesError, load_rules
from ..settings import Settings
from .ask import EXIT_STATUS

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "auto",
        help="answer requests automatically by TOML rules",
        description="Hold the namespace's provider lease (standing by while another holds it) and "
        "answer every request by the first matching rule of FILE. Invalid rules fail at start, "
        "naming the line at fault (exit 2).",
    )
    parser.add_argument("--rules", required=True, metavar="FILE", help="the TOML rules file (see docs/cli.md)")
    parser.add_argument("--name", metavar="NAME", help="this provider's name (default auto@HOST:PID)")
    parser.add_argument(
        "--no-standby",
        action="store_true",
        help="fail with DUPLICATE_PROVIDER (exit 16) instead of standing by when another provider holds the lease",
    )
    parser.add_argument(
        "--exit-on-lease-loss",
        action="store_true",
        help="exit with status 15 (LEASE_LOST) when the lease is lost, instead of standing by again",
    )
    parser.set_defaults(func=run)


def say(message: str) -> None:
    print(f"qbroker auto: {message}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    try:
        rules = load_rules(args.rules)
    except RulesError as error:
        say(f"invalid rules: {error}")
        return 2
    name = args.name or f"auto@{socket.gethostname()}:{os.getpid()}"
    main_task = asyncio.current_task()
    assert main_task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        async with settings.broker() as broker:
            return await _serve_forever(broker, rules, name, args)
    except asyncio.CancelledError:
        say("stopped")
        return 0
    except UserQuestionError as error:
        say(str(error))
        return EXIT_STATUS.get(error.code, 1)


async def _serve_forever(broker: Broker, rules: Rules, name: str, args: argparse.Namespace) -> int:
    def on_standby(holder: str) -> None:
        say(f"standing by: {holder} holds the lease of {broker.namespace}")

    backoff = Backoff()
    while True:
        try:
            async with broker.provider(name, standby=not args.no_standby, on_standby=on_standby) as provider:
                backoff.reset()
                say(f"holding the lease of {broker.namespace} as {name} (epoch {provider.epoch})")
                # Returns (rather than raises) on lease loss: `broker.provider()` wraps what
                # its body raises in an ExceptionGroup (its TaskGroup).
                await _serve(provider, rules, broker.namespace, name)
        except UserQuestionError as error:
            if error.code == DUPLICATE_PROVIDER:
                say(str(error))
                return EXIT_STATUS[DUPLICATE_PROVIDER]
            raise
        except Exception as error:  # Redis away (a restart, a network blip): stand by again once it is back
            if not redis_trouble(error):
                raise
            delay = backoff.next()
            say(f"Redis unavailable ({describe(error)}); retrying in {delay:.1f}s")
            await asyncio.sleep(delay)
            continue
        if args.exit_on_lease_loss:
            say("lost the lease: exiting")
            return EXIT_STATUS[LEASE_LOST]
        say("lost the lease: standing by again")


async def _serve(provider: Provider, rules: Rules, namespace: str, name: str) -> None:
    """Answer until the lease is lost; in-flight answers still try (and are refused) then."""
    async with asyncio.TaskGroup() as tasks:
        try:
            async for pending in provider:
                tasks.create_task(_handle(pending, rules, namespace, name))
        except UserQuestionError as error:
            if error.code != LEASE_LOST:
                raise


async def _handle(pending: PendingRequest, rules: Rules, namespace: str, name: str) -> None:
    rid = pending.request_id
    try:
        await _settle(pending, rules.decide(namespace, pending.request), name)
    except Exception:  # one request's trouble (Redis down a moment, ...) never stops the worker
        log.exception("could not settle %s", rid)


async def _settle(pending: PendingRequest, decision: Decision, name: str) -> None:
    rid = pending.request_id
    if decision.delay > 0:
        try:
            await asyncio.wait_for(pending.withdrawn.wait(), decision.delay)
        except TimeoutError:
            pass
        else:
            say(f"request {rid} was withdrawn by the asker")
            return
    lines = ",".join(str(line) if line else "default" for line in decision.lines)
    try:
        if decision.cancel is not None:
            await pending.cancel(decision.cancel, by=name)
            say(f"cancelled {rid} (rule {lines})")
        else:
            assert decision.answer is not None
            try:
                await pending.answer(decision.answer, by=name)
                say(f"answered {rid} (rule {lines})")
            except UserQuestionError as error:
                if error.code != BAD_ANSWER:
                    raise
                say(f"rule {lines} gives an answer that does not fit {rid}: {error.message}; cancelling it")
                await pending.cancel(f"the auto provider's rule does not fit: {error.message}", by=name)
    except UserQuestionError as error:
        if error.code == LEASE_LOST:
            say(f"late answer to {rid} refused: {error}")
        elif error.code == NOT_PENDING:
            say(f"{rid} is no longer pending: {error.message}")
        else:
            raise
