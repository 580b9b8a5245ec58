"""The engine of ``qbroker provide``: a human answering at this terminal."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import socket
import sys
from typing import TYPE_CHECKING, Literal

from broker import Broker, PendingRequest, Policies, PolicyError, Provider, Remember, Tally, UserQuestionError
from broker.answering.quorum import load_groups, load_policies, revoke_covered
from broker.backoff import Backoff
from broker.errors import BAD_ANSWER, DUPLICATE_PROVIDER, LEASE_LOST, NOT_APPROVER, NOT_PENDING
from workers._redis import describe, redis_trouble
from workers.exits import EXIT_STATUS
from workers.inert import inert
from workers.settings import Settings

if TYPE_CHECKING:
    from workers.answering.provide.terminal import Decision, Terminal

__all__ = ["load_policy_args", "serve"]

_Next = Literal["next", "lost", "quit", "handover"]
FIRST = asyncio.FIRST_COMPLETED


async def serve(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    name = args.name or f"{getpass.getuser()}@{socket.gethostname()}:{os.getpid()}"
    if not sys.stdin.isatty():
        print("qbroker provide: needs a terminal on stdin (for policies use `qbroker auto`)", file=sys.stderr)
        return 2
    from workers.answering.provide.terminal import Quit, Terminal  # prompt_toolkit and rich load only for this command

    remember_ttl = float(getattr(args, "remember_ttl", 3600.0))
    if remember_ttl:
        try:
            Remember(ttl=remember_ttl)
        except UserQuestionError as error:
            print(f"qbroker provide: --remember-ttl: {error}", file=sys.stderr)
            return 2

    try:
        policies = load_policy_args(args)
    except PolicyError as error:
        print(f"qbroker provide: {error}", file=sys.stderr)
        return 2
    person = getattr(args, "person", None) or getpass.getuser()
    terminal = Terminal(remember_ttl=remember_ttl)
    terminal.policies, terminal.person = policies, person
    backoff = Backoff()
    while True:
        try:
            async with settings.broker() as broker:
                terminal.fetch_attachment = broker.attachment
                return await _serve_forever(broker, terminal, name, standby=not args.no_standby)
        except (Quit, KeyboardInterrupt, asyncio.CancelledError):
            terminal.say("Stopped; the lease is handed on.")
            return 0
        except UserQuestionError as error:
            if not redis_trouble(error):
                terminal.say(str(error))
                return EXIT_STATUS.get(error.code, 1)
            delay = backoff.next()  # a provider waits for its Redis rather than exit
            terminal.say(f"Redis unavailable ({describe(error)}); retrying in {delay:.1f}s")
            await asyncio.sleep(delay)


async def _serve_forever(broker: Broker, terminal: Terminal, name: str, *, standby: bool) -> int:
    def on_standby(holder: str) -> None:
        terminal.say(f"Standing by: {holder} answers namespace {broker.namespace}; taking over when it goes.")

    backoff = Backoff()
    while True:
        step: _Next = "lost"
        try:
            async with broker.provider(name, standby=standby, on_standby=on_standby) as provider:
                backoff.reset()
                terminal.say(
                    f"Answering namespace {broker.namespace} as {name} (epoch {provider.epoch}).", "bold green"
                )
                if terminal.policies:
                    await revoke_covered(terminal.policies, broker, by=f"{name}: quorum policy")
                terminal.say("Waiting for questions…", "green")
                # Returns rather than raises: `broker.provider()` wraps what its body raises
                # in an ExceptionGroup (its TaskGroup).
                step = await _serve(provider, terminal)
            if step == "quit":  # said once the block has released the lease
                terminal.say("Stopped; the lease is handed on.")
                return 0
            terminal.handing_to = None
            if step == "handover" and provider.handover is not None:
                terminal.say(f"Handed the lease to {inert(provider.handover.to)}; standing by.", "bold yellow")
                if not standby:
                    return 0
                continue
        except Exception as error:  # Redis away (a restart, a network blip): stand by again once it is back
            if isinstance(error, UserQuestionError) and error.code == DUPLICATE_PROVIDER:
                terminal.say(str(error))
                return EXIT_STATUS[DUPLICATE_PROVIDER]
            if not redis_trouble(error):
                raise
            delay = backoff.next()
            terminal.say(f"Redis unavailable ({describe(error)}); retrying in {delay:.1f}s")
            await asyncio.sleep(delay)
            continue
        terminal.say("Lease lost: another provider answers now. Stopped presenting; standing by again.", "bold red")


async def _serve(provider: Provider, terminal: Terminal) -> _Next:
    requests = aiter(provider)
    try:
        while True:
            arriving = asyncio.ensure_future(anext(requests))
            quitting = asyncio.ensure_future(_ctrl_d_while_idle(terminal))
            try:
                await asyncio.wait({arriving, quitting}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                quitting.cancel()  # stdin goes back to the prompt before a request is shown
                await asyncio.gather(quitting, return_exceptions=True)
            if not arriving.done():  # Ctrl-D: a request delivered meanwhile goes to the next holder
                arriving.cancel()
                await asyncio.gather(arriving, return_exceptions=True)
                return "quit"
            try:
                pending = arriving.result()
            except StopAsyncIteration:
                return "handover" if provider.handover is not None else "lost"
            step = await _present(provider, terminal, pending)
            if step != "next":
                return step
    except UserQuestionError as error:
        if error.code != LEASE_LOST:
            raise
    return "lost"


async def _ctrl_d_while_idle(terminal: Terminal) -> None:
    """Return on end of file at the terminal (Ctrl-D) while no question is shown.

    Between prompts the terminal is in cooked mode: a line typed now is read and dropped.
    """
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    eof: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            if not eof.done():
                eof.set_result(None)
        elif data.strip():
            terminal.say("No question is waiting. Ctrl-D or Ctrl-C quits.")

    loop.add_reader(fd, readable)
    try:
        await eof
    finally:
        loop.remove_reader(fd)


async def _present(provider: Provider, terminal: Terminal, pending: PendingRequest) -> _Next:
    """Present one request and settle it."""
    if terminal.policies.for_card(pending) is not None:
        try:
            tally = await terminal.policies.current(pending)  # votes given before a failover; may settle it
        except UserQuestionError as error:
            terminal.say(f"Not shown: {error}", "bold red")
            return "lost" if error.code == LEASE_LOST else "next"
        assert tally is not None
        if tally.decided is not None:
            terminal.say(f"Decided by {', '.join(tally.by)} before this provider took over: settled.", "green")
            return "next"
        terminal.say(_tally_line(tally), "bold cyan")
    queued = max(0, provider.pending_count - 1)
    showing = asyncio.ensure_future(terminal.present(pending, queued))
    withdrawn = asyncio.ensure_future(pending.withdrawn.wait())
    lost = asyncio.ensure_future(provider.wait_lost())
    handover = asyncio.ensure_future(provider.wait_handover())
    try:
        done, _ = await asyncio.wait({showing, withdrawn, lost, handover}, return_when=FIRST)
        if done == {handover} and provider.handover is not None:  # told once; the question stays
            asked = provider.handover
            # Handing over never answers: h leaves the request pending, and the provider that asked gets it.
            terminal.handing_to = asked.to
            terminal.say(
                f"{inert(asked.by or 'someone')} asks to take over for {inert(asked.to)}: answer this request here,"
                f" or h: hand it to {inert(asked.to)} unanswered; then this terminal stands by. With neither, it"
                f" hands it over unanswered in {asked.grace:g}s."
            )
            done, _ = await asyncio.wait({showing, withdrawn, lost}, timeout=asked.grace, return_when=FIRST)
            if not done:  # nobody at the terminal: the page that asked gets the question, still pending
                terminal.say(f"Nobody answered within {asked.grace:g}s: handed on unanswered to {inert(asked.to)}.")
                return "handover"
    finally:
        for waiter in (withdrawn, lost, handover):
            waiter.cancel()
        if not showing.done():
            showing.cancel()
            await asyncio.gather(showing, return_exceptions=True)
    if not showing.done() or showing.cancelled():
        if provider.lost:
            return "lost"
        terminal.say("The asker withdrew this request; it is gone.")
        return "next"
    from workers.answering.provide.terminal import Quit

    try:
        decision = showing.result()
    except Quit:
        return "quit"
    if decision.handed_on:
        terminal.say("Handed on unanswered: it waits for the provider taking over.", "green")
        return "handover"
    return await _settle(provider, terminal, pending, decision)


async def _settle(provider: Provider, terminal: Terminal, pending: PendingRequest, decision: Decision) -> _Next:
    try:
        if terminal.policies.for_card(pending) is not None:
            return _voted(terminal, await _vote(terminal, pending, decision))
        route = terminal.policies.recorded_route(None)  # no policy covers it: routed to nobody (History shows it)
        if decision.cancelled:
            await pending.cancel("the human dismissed the question", by=provider.name, route=route)
            terminal.say("Cancelled: the asker is told ASK_CANCELLED.", "green")
        else:
            assert decision.answer is not None
            await pending.answer(decision.answer, by=provider.name, remember=decision.remember, route=route)
            if decision.remember is None:
                terminal.say("Answer sent.", "green")
            else:
                agents = sorted({asker.agent_id for asker in pending.askers if asker.agent_id})
                whom = f"agent {', '.join(agents)}" if decision.remember.scope == "agent" else "the namespace"
                terminal.say(f"Answer sent, and remembered for {whom} (qbroker decisions list / revoke).", "green")
    except UserQuestionError as error:
        if error.code == LEASE_LOST:
            terminal.say(f"Not sent: {error}", "bold red")
            return "lost"
        if error.code in (NOT_PENDING, BAD_ANSWER, NOT_APPROVER):
            terminal.say(f"Not sent: {error}", "bold red")
            return "next"
        raise
    return "next"


def load_policy_args(args: argparse.Namespace) -> Policies:
    """``--policy-file`` with the users file's ``[groups]`` (docs/approvals.md)."""
    import tomllib
    from pathlib import Path

    groups: dict[str, frozenset[str]] = {}
    users_file = getattr(args, "users_file", None)
    if users_file:
        try:
            groups = load_groups(tomllib.loads(Path(users_file).read_text()), str(users_file))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise PolicyError(f"cannot read users file {users_file}: {error}") from error
    policy_file = getattr(args, "policy_file", None)
    return load_policies(Path(policy_file) if policy_file else None, groups=groups)


async def _vote(terminal: Terminal, pending: PendingRequest, decision: Decision) -> Tally:
    """This terminal's person's one vote on a card a quorum policy covers."""
    answer = None if decision.cancelled else decision.answer
    message = f"{terminal.person} dismissed the question"
    policies, remember = terminal.policies, decision.remember
    tally = await policies.vote(pending, answer, by=terminal.person, message=message, remember=remember)
    assert tally is not None
    return tally


def _voted(terminal: Terminal, tally: Tally) -> _Next:
    if tally.decided is None:
        terminal.say(f"Your vote is recorded. {_tally_line(tally)}", "green")
    elif tally.decided.answer is None:
        terminal.say(f"Declined by {', '.join(tally.by)}: the asker is told ASK_CANCELLED.", "green")
    else:
        terminal.say(f"Answer sent, decided by {', '.join(tally.by)}.", "green")
    return "next"


def _tally_line(tally: Tally) -> str:
    view = tally.view()
    groups = f" from {', '.join(view['groups'])}" if view["groups"] else ""
    line = f"Policy {view['policy']}: needs {view['needed']} approvals{groups}"
    line += f"; approved by {', '.join(view['approvedBy']) or 'nobody yet'}"
    if view["declinedBy"]:
        line += f"; declined by {', '.join(view['declinedBy'])}"
    if view["mayStill"] is not None:
        line += f"; may still: {', '.join(view['mayStill']) or 'nobody'}"
    return line + "."
