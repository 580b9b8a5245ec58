"""The life of one ask: asked, waiting, detached, re-attached, ended (docs/architecture.md).

``ask()`` (broker/asking/_call.py) checks the request and hands it to an ``Ask``, which runs the
waterfall of answerers, enqueues the request for the namespace's provider (``ask.lua``), waits
on the process's inbox and, on every way out, withdraws or detaches it. Its ``state`` says
where it is; every change of it goes through ``Ask._to`` and the table ``TRANSITIONS``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from typing import Any, Literal

import msgspec

from .._redis_errors import unavailable
from .._scripts import Asked, Refusal, durable_release
from ..decisions import decision_setters, verified_decisions
from ..errors import (
    ASK_ABORTED,
    ASK_TIMED_OUT,
    BAD_REQUEST,
    BROKER_UNAVAILABLE,
    UserQuestionError,
)
from ..types import AskUserQuestionAnswer, AskUserQuestionRequest, Outcome, answered, decode_outcome, encode
from ..validation import check_answer
from ._ask_script import ask_script, asked
from ._ask_state import TRANSITIONS, AskState
from ._core import Answerer, AskingCore, Caller
from ._outcomes import answer_of, outcome_of
from .options import DEFAULT_ROUTING, Durable, Routing

__all__ = ["Ask"]

log = logging.getLogger(__name__)

_Withdrawal = Literal["withdrawn", "aborted", "timed_out"]

_ATTACH_TRIES = 5
_ENDED_BY_THE_RACE = (ASK_ABORTED, ASK_TIMED_OUT, BROKER_UNAVAILABLE)
"""the errors a withdrawal for an abort or a timeout brings about: the ask call says which of the two it was"""
_NOT_ASKED = Asked("")
"""the reply of an ask whose ask.lua call did not return (it was cancelled and the withdrawal found an outcome)"""


class Ask:
    """One ask in flight: enqueue, wait, and withdraw on every way out.

    Slotted, and its request JSON kept only until first sent: a process holds one per waiting ask (100 000 of
    them in a fleet's asking processes)."""

    __slots__ = (
        "_checked",
        "_ended",
        "_task",
        "_timer",
        "_watcher",
        "_wire",
        "agent",
        "attached_unsure",
        "core",
        "deadline",
        "durable",
        "ended_on_close",
        "future",
        "request",
        "request_id",
        "request_sha",
        "routing",
        "settled_after",
        "state",
        "withdrawal",
    )

    def __init__(
        self,
        core: AskingCore,
        request: AskUserQuestionRequest,
        agent: Caller | None,
        deadline: float | None,
        durable: Durable | None = None,
        routing: Routing = DEFAULT_ROUTING,
    ) -> None:
        self.core = core
        self.request = request
        self.agent = agent
        self.deadline = deadline
        self.durable = durable
        self.request_id = core.request_ids.next()
        wire = encode(request)
        self.request_sha = hashlib.sha256(wire).digest()
        """of the request JSON as asked: what the answer's seal names (in hex; kept as bytes, half the size)"""
        self._wire: bytes | None = wire
        """that JSON until the ask script first sends it (encoding the same request again gives the same bytes)"""
        self.withdrawal: _Withdrawal = "withdrawn"
        self.future: asyncio.Future[str] | None = None
        self.ended_on_close = False
        self.routing = routing
        self._checked: tuple[str, Outcome] | None = None
        """the last outcome ``accepts`` decoded and let through: the ask returns it without decoding again"""
        self.attached_unsure: str | None = None
        """a keyed request the re-attach may have made this process's before the ask was stopped"""
        self.settled_after: int | None = None
        """for a keyed ask that re-attached: the earliest (unix ms, Redis clock) its outcome may have
        been settled, the key being the asking side's to rewrite (an old answer must not pass)"""
        self.state = AskState.ASKED
        self._task: asyncio.Task[Any] | None = None
        """the task the ask call runs in: ``arm``'s timer or abort signal cancels it"""
        self._timer: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[Any] | None = None
        self._ended: _Withdrawal | None = None
        """how ``arm``'s timer or abort signal ended the ask, if one did"""

    def _take_wire(self) -> bytes:
        wire, self._wire = self._wire, None
        return encode(self.request) if wire is None else wire

    def end(self) -> None:
        """The ask call returned or raised (its caller says so on every way out)."""
        self._to(AskState.ENDED)

    def _to(self, state: AskState) -> None:
        """Move to ``state`` (``TRANSITIONS``); an ended ask stays ended (a late withdrawal may still detach)."""
        if self.state is AskState.ENDED:
            return
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"ask {self.request_id}: no way from {self.state.value} to {state.value}")
        self.state = state

    def arm(self, abort: asyncio.Event | None) -> None:
        """Race the ask call against its deadline and ``abort``, in the caller's own task: a timer, or a watcher
        of the signal, cancels that task and the withdrawal says ``timed_out`` or ``aborted``. ``raced`` ends the
        race; together they are the one place an ask's wait is ended from outside.

        No task for the work, no ``asyncio.wait`` and no coroutine of their own: a task and a wait per ask were
        two more turns of the event loop on the way to Redis and two on the way back (for every ask through the
        gateway), and every coroutine between the caller and the wait is kept per waiting ask.
        """
        if self.deadline is None and abort is None:
            return
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        if self.deadline is not None:
            self._timer = loop.call_at(self.deadline, _time_out, self, context=self.core.timer_context)
        if abort is not None:
            watcher = self._watcher = loop.create_task(abort.wait())
            watcher.add_done_callback(lambda waited: None if waited.cancelled() else self._end("aborted"))

    def raced(self, error: BaseException | None) -> UserQuestionError | None:
        """End the race ``arm`` started, the ask call having returned (``error`` None) or raised ``error``: what it
        raises instead (None: its own answer or error stands).

        An outcome that won the race with the withdrawal is still returned; a domain error from the far side wins
        over a simultaneous abort or timeout; the caller's own cancellation propagates.
        """
        if self._timer is not None:
            self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
        how, task = self._ended, self._task
        if how is None or task is None:
            return None
        if isinstance(error, asyncio.CancelledError):
            return None if task.uncancel() > 0 else self._ended_as(how)  # > 0: the caller's own cancellation too
        if error is not None and not isinstance(error, Exception):
            return None
        task.uncancel()
        if error is None or (isinstance(error, UserQuestionError) and error.code not in _ENDED_BY_THE_RACE):
            return None
        return self._ended_as(how)

    def _end(self, how: _Withdrawal) -> None:
        """``arm``'s timer or abort signal: withdraw as ``how`` (a method, not a closure per ask)."""
        if self._ended is None and self.state is not AskState.ENDED and self._task is not None:
            self._ended = self.withdrawal = how
            self._task.cancel()

    @staticmethod
    def _ended_as(how: _Withdrawal) -> UserQuestionError:
        if how == "aborted":
            return UserQuestionError("the ask was aborted", ASK_ABORTED)
        return UserQuestionError("nobody answered in time", ASK_TIMED_OUT)

    async def waterfall(self, answerers: list[Answerer], index: int) -> AskUserQuestionAnswer:
        """The answerers from ``index`` on, each passing the ask to the next; the provider ends the chain."""
        if index == len(answerers):
            return await self.remote()

        async def next_answerer() -> AskUserQuestionAnswer:
            return await self.waterfall(answerers, index + 1)

        answer = await answerers[index](self.request, next_answerer)
        # An answer passed on as the provider's seal named it keeps the name; one of the answerer's own has none.
        return answered(check_answer(self.request, answer, self.core.settings.limits), answer.answered_by or "")

    async def remote(self, abort: asyncio.Event | None = None, *, whole: bool = False) -> AskUserQuestionAnswer:
        """The end of the chain: enqueue for the namespace's provider and wait.

        ``whole``: this is the ask call's wait itself (no answerers), raced here against the deadline and ``abort``
        (``arm``, ``raced``) and ended on every way out, as the waterfall's caller does for a chain: no coroutine of
        the ask call's own, for every coroutine between the caller and the wait is kept per waiting ask.
        """
        if whole:
            self.arm(abort)
        core = self.core
        inbox = core.inbox
        decided: AskUserQuestionAnswer | None = None
        reply = _NOT_ASKED
        future = self.future = inbox.expect(self.request_id)
        core.asks[self.request_id] = self
        try:
            try:
                try:
                    reply = await asked(self.agent, self._enqueue)
                    future = self.future or future  # a keyed ask may have re-attached to another request id
                    kept = await self._kept_outcome(reply.value) if reply.kind == "settled" else None
                    if reply.kind == "decided":  # a remembered decision answered it in the script
                        decided = self._verified_decision(reply)
                        outcome = ""
                    elif kept is not None:
                        outcome = kept
                    else:
                        if reply.kind == "ok":
                            self._to(AskState.WAITING)
                        inbox.enqueued(self.request_id)
                        reply = _NOT_ASKED  # not kept while it waits (only a decision's reply is read after)
                        # The inbox's future itself: cancelling this task cancels it, and the withdrawal finds an
                        # outcome that won the race where it is durable (withdraw.lua says settled; its key holds it).
                        outcome = await future
                except asyncio.CancelledError:
                    # Shielded in a task of the broker's: a caller that keeps cancelling (an anyio
                    # cancel scope does) must not stop the withdrawal half-way.
                    settled = await asyncio.shield(core.track(self._withdraw(future)))
                    if settled is None:
                        raise
                    outcome = settled
            except Exception as error:
                coded = self._coded(error, future)
                if coded is error:
                    raise
                raise coded from error
            finally:
                inbox.forget(self.request_id)
                core.asks.pop(self.request_id, None)
            answer = self._collected(reply, decided, outcome)
            if answer is None:
                answer = await self.remote()
        except BaseException as error:
            instead = self.raced(error) if whole else None
            if instead is None:
                raise
            raise instead from (None if isinstance(error, asyncio.CancelledError) else error)
        finally:
            if whole:
                self.end()
        if whole:
            self.raced(None)
        return answer

    async def _enqueue(self) -> Asked | Refusal:
        """ask.lua for this ask (keyed: ``_ask_keyed``), with what is left of its deadline."""
        timeout_ms = ""
        if self.deadline is not None:
            remaining = self.deadline - asyncio.get_running_loop().time()
            timeout_ms = str(max(1, int(remaining * 1000)))
        if self.durable is None:
            asked = await ask_script(
                self.core,
                self.request,
                self.agent,
                self.request_id,
                timeout_ms=timeout_ms,
                routing=self.routing,
                wire=self._take_wire(),
            )
        else:
            asked = await self._ask_keyed(timeout_ms)
        return asked

    def _coded(self, error: Exception, future: asyncio.Future[str]) -> UserQuestionError:
        """What the ask call raises for ``error``; on an outage its request is withdrawn once Redis is back."""
        coded = error if isinstance(error, UserQuestionError) else unavailable(error, "asking")
        if coded.code == BROKER_UNAVAILABLE and not self.ended_on_close:
            # Redis failed us; once it is back, a human must not answer into the void (a keyed
            # question is only detached: its asker may come back for it).
            self.core.track(self._withdraw_quietly(future))
        return coded

    def _collected(
        self, reply: Asked, decided: AskUserQuestionAnswer | None, outcome: str
    ) -> AskUserQuestionAnswer | None:
        """The ask call's answer, its outcome collected; None: ask a human again, under a new request id."""
        core = self.core
        # The request's keys go only now, after the ask call returned: a retried ask can then
        # never land after them and enqueue the question again.
        core.forget_settled(self.request_id)
        commands = core.open_commands  # None once closed: a clean-up is dropped then
        if self.durable is not None and reply.kind != "decided" and commands is not None:
            # received: the key names nothing any more
            durable_release(
                commands, durable=core.keys.durable(self.request.agent, self.durable.key), rid=self.request_id
            )
        if reply.kind == "decided":
            if decided is not None:
                core.remembered_answers += 1
                core.last_remembered_by = decision_setters(list(reply.records))
                return answered(decided, ", ".join(core.last_remembered_by))
            # No trusted key signed what the lookup found for this request: a human answers, as a new request.
            core.rejected(self.request_id, "a remembered decision", "asking a human instead")
            self.request_id = core.request_ids.next()
            self.routing = dataclasses.replace(self.routing, lookup=False)
            self._to(AskState.ASKED)
            return None
        checked = self._checked
        return answer_of(outcome, checked[1] if checked is not None and checked[0] is outcome else None)

    def accepts(self, outcome: str, request_id: str | None = None) -> bool:
        """Whether ``outcome`` may end this ask: an error may; an answer only when sealed for this request.

        ``request_id``: the request it would end (a keyed ask's re-attach names another than its own).
        """
        core = self.core
        request_id = request_id or self.request_id
        try:
            decoded = decode_outcome(outcome)
        except msgspec.DecodeError:
            core.rejected(request_id, "an outcome that does not decode")
            return False
        if decoded.answer is None:
            self._checked = (outcome, decoded)
            return True  # forging an error ends the ask, as withdrawing it would (docs/security.md)
        if decoded.proof is None or decoded.signed is None:
            core.rejected(request_id, "an unsigned answer")
            return False
        durable = self.durable
        if not core.trust.trusted_keys.verify_outcome(
            namespace=core.settings.namespace,
            request_id=request_id,
            request_sha=self.request_sha.hex(),
            agent=self.request.agent or "",
            # A keyed request may have been shown to the provider under another process of its agent.
            client=None if durable is not None else core.client_id,
            body=decoded.signed,
            proof=decoded.proof,
            durable=durable.key if durable is not None else "",
            settled_after=self.settled_after,
        ):
            core.rejected(request_id, "an answer")
            return False
        self._checked = (outcome, decoded)
        return True

    def _verified_decision(self, reply: Asked) -> AskUserQuestionAnswer | None:
        core = self.core
        return verified_decisions(
            core.trust.trusted_keys, core.settings.namespace, self.request, list(reply.records), reply.now_ms
        )

    async def _ask_keyed(self, timeout_ms: str) -> Asked | Refusal:
        """ask.lua for a keyed ask: a new request, or the key's own one re-attached.

        The durable key is read first (a script may touch only the keys it is given); the
        script refuses with 'retry' when it changed meanwhile. Both possible request ids are
        awaited before the script runs, so a notice arriving just after it is never missed.
        """
        core = self.core
        inbox = core.inbox
        assert inbox is not None and self.durable is not None
        durable_key = core.keys.durable(self.request.agent, self.durable.key)
        # The key names a request through a value the asking side can rewrite: an outcome counts
        # only if it was sealed since this ask could have been waiting for it (its keep: the result
        # TTL or the detach grace, whichever is longer; 10 s of slack for the provider's clock).
        seconds, micros = await core.commands.call("TIME")
        keep_ms = max(int(core.settings.result_ttl * 1000), self.durable.grace_ms) + 10_000
        self.settled_after = int(seconds) * 1000 + int(micros) // 1000 - keep_ms
        for _ in range(_ATTACH_TRIES):
            named: str | None = await core.commands.call("GET", durable_key)
            if named is not None and named in core.asks:
                raise UserQuestionError(f"key {self.durable.key!r} is being asked already by this process", BAD_REQUEST)
            attach = None if named is None else inbox.expect(named)
            if named is not None:
                core.attaching[named] = self  # a notice for it meanwhile is checked as this ask's
            try:
                reply = await ask_script(
                    core,
                    self.request,
                    self.agent,
                    self.request_id,
                    timeout_ms=timeout_ms,
                    durable=self.durable,
                    named=named,
                    routing=self.routing,
                    wire=self._take_wire(),
                )
            except BaseException:
                if named is not None:
                    inbox.forget(named)
                    # The script may have run (its reply lost with the cancellation): then the hash names this
                    # process, which no longer waits; the withdrawal detaches it (detach.lua checks the client).
                    self.attached_unsure = named
                raise
            finally:
                if named is not None:
                    core.attaching.pop(named, None)
            if isinstance(reply, Refusal):
                if named is not None:
                    inbox.forget(named)
                return reply
            if reply.kind == "retry":
                if named is not None:
                    inbox.forget(named)
                continue
            if reply.kind in ("attached", "settled") and named is not None and attach is not None:
                inbox.forget(self.request_id)
                del core.asks[self.request_id]
                self.request_id, self.future = named, attach
                core.asks[named] = self
                self._to(AskState.REATTACHED)
                if reply.kind == "attached" and reply.value and reply.value != core.client_id:
                    core.tell_replaced(self.request_id, reply.value)
            elif named is not None:
                inbox.forget(named)
            return reply
        raise UserQuestionError(
            f"key {self.durable.key!r} changed hands {_ATTACH_TRIES} times while asking", BROKER_UNAVAILABLE
        )

    async def _kept_outcome(self, state: str) -> str | None:
        """The outcome of a keyed request settled while its asker was away (None: not one to accept; wait)."""
        outcome: str | None = await self.core.commands.call("GET", self.core.keys.outcome(self.request_id))
        if outcome is None:
            raise UserQuestionError(
                f"request {self.request_id} was {state} while its asker was away, and the outcome has expired",
                ASK_TIMED_OUT,
            )
        return outcome if self.accepts(outcome) else None

    async def end_on_close(self) -> None:
        """The broker closes: withdraw, and end the wait with the outcome if one came first."""
        self.ended_on_close = True
        future = self.future
        if future is None or future.done():
            return
        try:
            outcome = await self._withdraw(future)
        except Exception as error:
            log.warning("could not withdraw request %s on close: %r", self.request_id, error)
            outcome = None
        if not future.done():
            if outcome is not None:
                future.set_result(outcome)
            else:
                future.set_exception(
                    UserQuestionError("the broker was closed while the ask waited", BROKER_UNAVAILABLE)
                )

    async def _withdraw_quietly(self, future: asyncio.Future[str]) -> None:
        try:
            await self._withdraw(future)
        except Exception as error:
            log.warning("could not withdraw request %s: %r (housekeeping reaps it)", self.request_id, error)

    async def _withdraw(self, future: asyncio.Future[str]) -> str | None:
        """Withdraw the request; if it was settled first, return that outcome instead."""
        settled = outcome_of(future)
        if settled is not None:
            return settled
        core = self.core
        keys = core.keys
        if self.durable is not None and self.attached_unsure is not None:
            await core.detach(self.attached_unsure)
        if self.durable is not None and self.withdrawal == "withdrawn":
            # A keyed ask is given up only by an abort or a timeout; otherwise it is detached.
            detached = await core.detach(self.request_id)
            if detached.kind != "settled":
                self._to(AskState.DETACHED)
                return outcome_of(future)
            outcome_key = keys.outcome(self.request_id)
            outcome: str | None = await core.commands.call("GET", outcome_key)
            return outcome if outcome is not None and self.accepts(outcome) else outcome_of(future)
        withdrawn = await core.withdraw(self.request_id, self.withdrawal)
        if withdrawn.kind != "settled":
            return outcome_of(future)
        outcome_key = keys.outcome(self.request_id)
        outcome = await core.commands.call("GET", outcome_key)
        if outcome is None or not self.accepts(outcome):
            return outcome_of(future)  # the inbox waiter took the outcome meanwhile
        core.clean_up(self.request_id)
        return outcome


def _time_out(ask: Ask) -> None:
    """An ask's deadline passed (a function, not a bound method and its argument: one object less per waiting ask)."""
    ask._end("timed_out")
