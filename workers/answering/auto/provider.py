"""The engine of ``qbroker auto``: hold the lease and answer each request by the rules."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from broker import Broker, PendingRequest, Policies, PolicyError, Provider, UserQuestionError
from broker.answering.quorum import revoke_covered
from broker.backoff import Backoff
from broker.errors import BAD_ANSWER, DUPLICATE_PROVIDER, LEASE_LOST, NOT_PENDING
from workers._redis import describe, redis_trouble
from workers.answering.auto.rules import Decision, Rules, RulesError, load_rules
from workers.answering.provide.provider import load_policy_args
from workers.exits import EXIT_STATUS
from workers.settings import Settings

__all__ = ["serve"]

log = logging.getLogger(__name__)


def say(message: str) -> None:
    print(f"qbroker auto: {message}", file=sys.stderr, flush=True)


async def serve(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    try:
        rules = load_rules(args.rules)
    except RulesError as error:
        say(f"invalid rules: {error}")
        return 2
    try:
        policies = load_policy_args(args)
    except PolicyError as error:
        say(f"invalid policies: {error}")
        return 2
    name = args.name or f"auto@{socket.gethostname()}:{os.getpid()}"
    main_task = asyncio.current_task()
    assert main_task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    backoff = Backoff()
    while True:
        try:
            async with settings.broker() as broker:
                return await _serve_forever(broker, rules, policies, name, args)
        except asyncio.CancelledError:
            say("stopped")
            return 0
        except UserQuestionError as error:
            if not redis_trouble(error):
                say(str(error))
                return EXIT_STATUS.get(error.code, 1)
            delay = backoff.next()  # a provider waits for its Redis rather than exit
            say(f"Redis unavailable ({describe(error)}); retrying in {delay:.1f}s")
            await asyncio.sleep(delay)


async def _serve_forever(broker: Broker, rules: Rules, policies: Policies, name: str, args: argparse.Namespace) -> int:
    def on_standby(holder: str) -> None:
        say(f"standing by: {holder} holds the lease of {broker.namespace}")

    backoff = Backoff()
    while True:
        try:
            # A policy decides by the asking agent: it must see each asker, never one card for several.
            # Its settlements are no person's decisions: automatic keeps them out of the audit's human record.
            async with broker.provider(
                name, standby=not args.no_standby, on_standby=on_standby, coalesce=False, automatic=True
            ) as provider:
                backoff.reset()
                say(f"holding the lease of {broker.namespace} as {name} (epoch {provider.epoch})")
                if policies:  # a decision remembered before must not answer a covered question either
                    await revoke_covered(policies, broker, by=f"{name}: quorum policy")
                # Returns (rather than raises) on lease loss: `broker.provider()` wraps what
                # its body raises in an ExceptionGroup (its TaskGroup).
                await _serve(provider, rules, policies, broker.namespace, name)
            if provider.handover is not None:  # what it was answering is answered; the asker of the lease takes it
                say(f"{provider.handover.by or 'someone'} asked for the lease: handed it to {provider.handover.to}")
                continue
        except Exception as error:  # Redis away (a restart, a network blip): stand by again once it is back
            if isinstance(error, UserQuestionError) and error.code == DUPLICATE_PROVIDER:
                say(str(error))
                return EXIT_STATUS[DUPLICATE_PROVIDER]
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


async def _serve(provider: Provider, rules: Rules, policies: Policies, namespace: str, name: str) -> None:
    """Answer until the lease is lost; in-flight answers still try (and are refused) then."""
    loop = asyncio.get_running_loop()
    # A rule's delay is a timer, not a task waiting: told to stop (SIGTERM) with 100 000 waiting, the
    # worker cancels the timers at once and lets go of the lease, rather than cancel a task per request.
    waiting: dict[str, asyncio.TimerHandle] = {}
    async with asyncio.TaskGroup() as tasks:

        def settle(pending: PendingRequest, decision: Decision) -> None:
            waiting.pop(pending.request_id, None)
            if pending.withdrawn.is_set():
                say(f"request {pending.request_id} was withdrawn by the asker")
                return
            tasks.create_task(_handle(pending, decision, name))

        try:
            async for pending in provider:
                policy = policies.for_card(pending)
                if policy is not None:
                    # A rule is not a person: were its answer one vote, a policy of one approval would let
                    # it decide alone. The card waits, pending, for people (a web provider taking the lease).
                    needs = f"{policy.approvals} approval{'s' if policy.approvals != 1 else ''}"
                    say(f"left {pending.request_id} to humans: policy {policy.name!r} needs {needs}")
                    continue
                try:
                    decision = rules.decide(namespace, pending.request, verified=pending.verified)
                except Exception:  # one request's trouble never stops the worker
                    log.exception("could not settle %s", pending.request_id)
                    continue
                if decision.delay > 0:
                    waiting[pending.request_id] = loop.call_later(decision.delay, settle, pending, decision)
                else:
                    settle(pending, decision)
        except UserQuestionError as error:
            if error.code != LEASE_LOST:
                raise
        finally:
            for timer in waiting.values():
                timer.cancel()


async def _handle(pending: PendingRequest, decision: Decision, name: str) -> None:
    rid = pending.request_id
    try:
        await _settle(pending, decision, name)
    except Exception:  # one request's trouble (Redis down a moment, ...) never stops the worker
        log.exception("could not settle %s", rid)


def _which_rules(lines: tuple[int, ...]) -> str:
    """``rule at line 11``, ``rules at lines 5, 11``, ``the default rule``: line numbers of the rules file."""
    where = sorted({line for line in lines if line})
    parts = []
    if where:
        parts.append(f"rule at line {where[0]}" if len(where) == 1 else f"rules at lines {', '.join(map(str, where))}")
    if 0 in lines or not lines:
        parts.append("the default rule")
    return " and ".join(parts)


async def _settle(pending: PendingRequest, decision: Decision, name: str) -> None:
    rid = pending.request_id
    rule = _which_rules(decision.lines)
    try:
        if decision.cancel is not None:
            await pending.cancel(decision.cancel, by=name)
            say(f"cancelled {rid} ({rule})")
        else:
            assert decision.answer is not None
            try:
                await pending.answer(decision.answer, by=name)
                say(f"answered {rid} ({rule})")
            except UserQuestionError as error:
                if error.code != BAD_ANSWER:
                    raise
                say(f"{rule} gives an answer that does not fit {rid}: {error.message}; cancelling it")
                await pending.cancel(f"the auto provider's rule does not fit: {error.message}", by=name)
    except UserQuestionError as error:
        if error.code == LEASE_LOST:
            say(f"late answer to {rid} refused: {error}")
        elif error.code == NOT_PENDING:
            say(f"{rid} is no longer pending: {error.message}")
        else:
            raise
