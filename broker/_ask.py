"""The life of one ask: asked, waiting, detached, re-attached, ended (docs/architecture.md).

``Broker.ask()`` checks the request and hands it to an ``_Ask``, which runs the waterfall of
answerers, enqueues the request for the namespace's provider (``ask.lua``), waits on the
process's inbox and, on every way out, withdraws or detaches it. Its ``state`` says where it is;
every change of it goes through ``_Ask._to`` and the table ``TRANSITIONS``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from . import _scripts as scripts
from ._keys import TOMBSTONE_MS
from ._redis_errors import unavailable
from ._scripts import Asked, Refusal
from .agents import Agent
from .decisions import decision_keys, decision_setters, verified_decisions
from .errors import (
    ASK_ABORTED,
    ASK_TIMED_OUT,
    BAD_REQUEST,
    BROKER_UNAVAILABLE,
    CALLER_NOT_LIVE,
    UserQuestionError,
)
from .types import AskUserQuestionAnswer, AskUserQuestionRequest, Outcome, answered, decode_outcome, encode
from .validation import check_answer

if TYPE_CHECKING:
    from .broker import Broker

__all__ = ["DEFAULT_ROUTING", "TRANSITIONS", "Answerer", "AskState", "Next", "ask_script"]

log = logging.getLogger(__name__)

Next = Callable[[], Awaitable[AskUserQuestionAnswer]]
Answerer = Callable[[AskUserQuestionRequest, Next], Awaitable[AskUserQuestionAnswer]]
_Withdrawal = Literal["withdrawn", "aborted", "timed_out"]

_KEY = re.compile(r"^[^\x00-\x20\x7f]{1,200}$")
_ATTACH_TRIES = 5
_NOT_ASKED = Asked("")
"""the reply of an ask whose ask.lua call did not return (it was cancelled and the withdrawal found an outcome)"""


@dataclass(frozen=True)
class _Durable:
    """A keyed ask's key and detach grace."""

    key: str
    grace_ms: int

    @staticmethod
    def digest(wire: bytes) -> str:
        """What makes two asks under one key the same request: their wire JSON."""
        return hashlib.sha1(wire).hexdigest()


@dataclass(frozen=True)
class _Routing:
    """What may answer an ask besides a human answering it alone."""

    remember: bool = True
    """a remembered decision may answer it, and its answer may be remembered"""
    coalesce: bool = True
    """it may be presented once with identical pending requests of other askers"""
    lookup: bool = True
    """look remembered decisions up (False after a lookup found one that does not verify)"""

    def __post_init__(self) -> None:
        for name in ("remember", "coalesce"):
            if not isinstance(getattr(self, name), bool):
                raise UserQuestionError(f"{name} must be True or False", BAD_REQUEST)


DEFAULT_ROUTING = _Routing()
_ROUTINGS = {
    (remember, coalesce): _Routing(remember, coalesce) for remember in (True, False) for coalesce in (True, False)
}


def routing_of(remember: bool, coalesce: bool) -> _Routing:
    """The routing of an ask's ``remember`` and ``coalesce``: one shared record per choice (else a record per
    waiting ask); anything but True or False is refused as ``_Routing`` refuses it."""
    if type(remember) is bool and type(coalesce) is bool:
        return _ROUTINGS[(remember, coalesce)]
    return _Routing(remember, coalesce)


def _durable(key: object, grace: float | None, default: float) -> _Durable | None:
    if key is None:
        if grace is not None:
            raise UserQuestionError("detach_grace applies to a keyed ask only: pass key= too", BAD_REQUEST)
        return None
    if not isinstance(key, str) or not _KEY.match(key):
        raise UserQuestionError(
            f"key {key!r} must be 1-200 characters with no spaces or control characters", BAD_REQUEST
        )
    grace = default if grace is None else grace
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace <= 30 * 86_400:
        raise UserQuestionError(f"detach_grace {grace!r} must be 0 to 30 days, in seconds", BAD_REQUEST)
    return _Durable(key, int(grace * 1000))


class AskState(enum.Enum):
    """Where one ask is in its life; ``_Ask.state``, changed by ``_Ask._to`` only (``TRANSITIONS``)."""

    ASKED = "asked"
    """checked and handed over: the waterfall runs, or ask.lua is called (again, with a new request id, after a
    remembered decision that did not verify)"""
    WAITING = "waiting"
    """ask.lua enqueued its own request: the process's inbox brings the outcome"""
    REATTACHED = "re-attached"
    """a keyed ask took over the pending (or settled, uncollected) request its key names, asked by an earlier
    process: it waits on that request's id"""
    DETACHED = "detached"
    """a keyed ask stopped without an abort or a timeout (cancelled, closed, an outage): its request stays
    pending, answerable, for its detach grace, for a later ask with the same key to re-attach"""
    ENDED = "ended"
    """the ask call returned or raised; final (a withdrawal still in flight may finish after it)"""


TRANSITIONS: dict[AskState, frozenset[AskState]] = {
    AskState.ASKED: frozenset(
        {AskState.ASKED, AskState.WAITING, AskState.REATTACHED, AskState.DETACHED, AskState.ENDED}
    ),
    AskState.WAITING: frozenset({AskState.DETACHED, AskState.ENDED}),
    AskState.REATTACHED: frozenset({AskState.DETACHED, AskState.ENDED}),
    # DETACHED to WAITING or REATTACHED: the broker closed while ask.lua ran (end_on_close detached it), its reply
    # came after
    AskState.DETACHED: frozenset({AskState.DETACHED, AskState.WAITING, AskState.REATTACHED, AskState.ENDED}),
    AskState.ENDED: frozenset(),
}
"""the states an ask may go to from each; ASKED to DETACHED: stopped while ask.lua ran (its reply may be lost)"""


async def ask_script(
    broker: Broker,
    request: AskUserQuestionRequest,
    agent: Agent | None,
    request_id: str,
    *,
    gate_only: bool = False,
    timeout_ms: str = "",
    durable: _Durable | None = None,
    named: str | None = None,
    routing: _Routing = _Routing(),
    wire: bytes | None = None,
) -> Asked | Refusal:
    """Run ask.lua; a keyed ask names the durable key's request as it read it (``named``)."""
    body = wire if wire is not None else encode(request)
    keys = broker.keys
    request_key = keys.request(request_id)
    found = decision_keys(keys, request) if routing.remember and routing.lookup and not gate_only else []
    looked_up = len(found) // 2
    attest = None
    if not gate_only and broker.attest_key is not None and agent is not None:  # checked by the provider
        attest = broker.attest_key.attest(
            namespace=broker.namespace,
            request_id=request_id,
            request_sha=hashlib.sha256(body).hexdigest(),
            agent=agent.id,
            client=broker.client_id,
        )
    return await scripts.ask(
        broker.commands,
        keys=scripts.AskKeys(
            requests=keys.requests,
            request=request_key,
            record=keys.agent(agent.id) if agent is not None else request_key,
            asklog=keys.asklog,
            durable=keys.durable(request.agent, durable.key) if durable is not None else request_key,
            named=keys.request(named) if named else request_key,
        ),
        argv=scripts.AskArgv(
            rid=request_id,
            body=b"" if gate_only else body,
            agent=agent.id if agent is not None else "",
            token=agent.token if agent is not None else "",
            client=broker.client_id,
            request_ttl=int(broker.request_ttl * 1000),
            log_max=broker._provider_settings.audit_maxlen,
            timeout=timeout_ms,
            gate_only="1" if gate_only else "0",
            token_sha=agent.fingerprint if agent is not None else "",
            key=durable.key if durable is not None else "",
            grace=durable.grace_ms if durable is not None else 0,
            digest=durable.digest(body) if durable is not None else "",
        ),
        enqueue=None
        if gate_only
        else scripts.AskEnqueue(
            outcome=keys.outcome(request_id),
            away=keys.away,
            solo="" if routing.coalesce else "solo",
            remember=("1" if routing.lookup else "x") if routing.remember else "0",
            result_ttl=int(broker._provider_settings.result_ttl * 1000),
            lease=keys.provider,  # read-only keys come in ARGV (broker/roles.py: the asker may only read them)
            standbys=keys.standbys,
            questions=[item.id for item in request.questions[:looked_up]] if looked_up else (),
            decision_keys=found,
            attest=attest,
        ),
    )


class _Ask:
    """One ask in flight: enqueue, wait, and withdraw on every way out.

    Slotted, and its request JSON kept only until first sent: a process holds one per waiting ask (100 000 of
    them in a fleet's asking processes)."""

    __slots__ = (
        "_checked",
        "_ended",
        "_task",
        "_wire",
        "agent",
        "attached_unsure",
        "broker",
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
        broker: Broker,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        deadline: float | None,
        durable: _Durable | None = None,
        routing: _Routing = _Routing(),
    ) -> None:
        self.broker = broker
        self.request = request
        self.agent = agent
        self.deadline = deadline
        self.durable = durable
        self.request_id = broker._request_ids.next()
        wire = encode(request)
        self.request_sha = hashlib.sha256(wire).hexdigest()
        """of the request JSON as asked: what the answer's seal names"""
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
        """the task ``remote_until`` waits in: its timer or abort signal cancels it"""
        self._ended: _Withdrawal | None = None
        """how ``remote_until``'s timer or abort signal ended the ask, if one did"""

    def _take_wire(self) -> bytes:
        wire, self._wire = self._wire, None
        return encode(self.request) if wire is None else wire

    def _to(self, state: AskState) -> None:
        """Move to ``state`` (``TRANSITIONS``); an ended ask stays ended (a late withdrawal may still detach)."""
        if self.state is AskState.ENDED:
            return
        if state not in TRANSITIONS[self.state]:
            raise AssertionError(f"ask {self.request_id}: no way from {self.state.value} to {state.value}")
        self.state = state

    def ask(self, answerers: list[Answerer], abort: asyncio.Event | None) -> Coroutine[Any, Any, AskUserQuestionAnswer]:
        """The ask call: the waterfall (or straight to the provider). Its caller ends the ask on every way out
        (``_to(AskState.ENDED)``): a coroutine of its own here would be one more frame kept per waiting ask."""
        if answerers:
            return self.run(answerers, abort, self.deadline)
        if self.deadline is None and abort is None:
            return self.remote()
        return self.remote_until(self.deadline, abort)

    async def run(
        self, answerers: list[Answerer], abort: asyncio.Event | None, deadline: float | None
    ) -> AskUserQuestionAnswer:
        """Run the waterfall, racing the abort signal and the deadline."""
        work = asyncio.ensure_future(self._waterfall(answerers, 0))
        aborted = asyncio.ensure_future(abort.wait()) if abort is not None else None
        waits: set[asyncio.Future[Any]] = {work} if aborted is None else {work, aborted}
        timeout = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._stop(work, "withdrawn")
            raise
        finally:
            if aborted is not None:
                aborted.cancel()
        if work.done():
            return work.result()
        code, why = (
            (ASK_ABORTED, "the ask was aborted")
            if aborted is not None and aborted.done()
            else (ASK_TIMED_OUT, "nobody answered in time")
        )
        try:
            return await self._stop(work, "aborted" if code == ASK_ABORTED else "timed_out")
        except asyncio.CancelledError:
            raise UserQuestionError(why, code) from None
        except UserQuestionError as error:
            if error.code in (ASK_ABORTED, ASK_TIMED_OUT, BROKER_UNAVAILABLE):
                raise UserQuestionError(why, code) from error
            raise  # a domain error from the far side wins over a simultaneous abort
        except Exception as error:
            raise UserQuestionError(why, code) from error

    async def remote_until(self, deadline: float | None, abort: asyncio.Event | None) -> AskUserQuestionAnswer:
        """``remote()`` in the caller's own task, ended at ``deadline`` or by ``abort`` as ``run()`` would end it.

        The common cases (no answerers; a timeout, an abort signal or both) without a task for the
        work and ``asyncio.wait``: a timer, or a watcher of the signal, cancels this task, the
        withdrawal says ``timed_out`` or ``aborted``, and an outcome that won the race with the
        withdrawal is still returned. (A task and a wait per ask were two more turns of the event loop
        on the way to Redis and two on the way back, for every ask through the gateway.)
        """
        loop = asyncio.get_running_loop()
        task = self._task = asyncio.current_task()
        assert task is not None
        handle = loop.call_at(deadline, self._end, "timed_out") if deadline is not None else None
        watcher = None
        if abort is not None:
            watcher = loop.create_task(abort.wait())
            watcher.add_done_callback(lambda waited: None if waited.cancelled() else self._end("aborted"))
        try:
            answer = await self.remote()
        except asyncio.CancelledError:
            if self._ended is None or task.uncancel() > 0:  # the caller's own cancellation too
                raise
            raise self._ended_as(self._ended) from None
        except UserQuestionError as error:
            if self._ended is None:
                raise
            task.uncancel()
            if error.code in (ASK_ABORTED, ASK_TIMED_OUT, BROKER_UNAVAILABLE):
                raise self._ended_as(self._ended) from error
            raise  # a domain error from the far side wins over a simultaneous abort or timeout
        except Exception as error:
            if self._ended is None:
                raise
            task.uncancel()
            raise self._ended_as(self._ended) from error
        finally:
            if handle is not None:
                handle.cancel()
            if watcher is not None:
                watcher.cancel()
        if self._ended is not None:
            task.uncancel()
        return answer

    def _end(self, how: _Withdrawal) -> None:
        """``remote_until``'s timer or abort signal: withdraw as ``how`` (a method, not a closure per ask)."""
        if self._ended is None and self.state is not AskState.ENDED and self._task is not None:
            self._ended = self.withdrawal = how
            self._task.cancel()

    @staticmethod
    def _ended_as(how: _Withdrawal) -> UserQuestionError:
        if how == "aborted":
            return UserQuestionError("the ask was aborted", ASK_ABORTED)
        return UserQuestionError("nobody answered in time", ASK_TIMED_OUT)

    async def _stop(
        self, work: asyncio.Future[AskUserQuestionAnswer], withdrawal: _Withdrawal
    ) -> AskUserQuestionAnswer:
        self.withdrawal = withdrawal
        work.cancel()
        return await work

    async def _waterfall(self, answerers: list[Answerer], index: int) -> AskUserQuestionAnswer:
        if index == len(answerers):
            return await self.remote()

        async def next_answerer() -> AskUserQuestionAnswer:
            return await self._waterfall(answerers, index + 1)

        answer = await answerers[index](self.request, next_answerer)
        # An answer passed on as the provider's seal named it keeps the name; one of the answerer's own has none.
        return answered(check_answer(self.request, answer, self.broker.limits), answer.answered_by or "")

    async def remote(self) -> AskUserQuestionAnswer:
        """The end of the chain: enqueue for the namespace's provider and wait."""
        broker = self.broker
        inbox = broker._inbox
        assert inbox is not None
        decided: AskUserQuestionAnswer | None = None
        reply = _NOT_ASKED
        future = self.future = inbox.expect(self.request_id)
        broker._asks[self.request_id] = self
        try:
            try:
                timeout_ms = ""
                if self.deadline is not None:
                    remaining = self.deadline - asyncio.get_running_loop().time()
                    timeout_ms = str(max(1, int(remaining * 1000)))
                if self.durable is None:
                    asked = await ask_script(
                        broker,
                        self.request,
                        self.agent,
                        self.request_id,
                        timeout_ms=timeout_ms,
                        routing=self.routing,
                        wire=self._take_wire(),
                    )
                else:
                    asked = await self._ask_keyed(timeout_ms)
                    future = self.future or future
                if isinstance(asked, Refusal):
                    raise asked.error()
                reply = asked
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
                    # Through a follower: cancelling this task must not cancel the future the inbox resolves.
                    outcome = await _follower(future)
            except asyncio.CancelledError:
                # Shielded in a task of the broker's: a caller that keeps cancelling (an anyio
                # cancel scope does) must not stop the withdrawal half-way.
                settled = await asyncio.shield(broker._track(self._withdraw(future)))
                if settled is None:
                    raise
                outcome = settled
        except Exception as error:
            coded = error if isinstance(error, UserQuestionError) else unavailable(error, "asking")
            if coded.code == BROKER_UNAVAILABLE and not self.ended_on_close:
                # Redis failed us; once it is back, a human must not answer into the void (a keyed
                # question is only detached: its asker may come back for it).
                broker._track(self._withdraw_quietly(future))
            if coded is error:
                raise
            raise coded from error
        finally:
            inbox.forget(self.request_id)
            broker._asks.pop(self.request_id, None)
        # The request's keys go only now, after the ask call returned: a retried ask can then
        # never land after them and enqueue the question again.
        broker._forget_settled(self.request_id)
        commands = broker._open_commands  # None once closed: a clean-up is dropped then
        if self.durable is not None and reply.kind != "decided" and commands is not None:
            # received: the key names nothing any more
            scripts.durable_release(
                commands, durable=broker.keys.durable(self.request.agent, self.durable.key), rid=self.request_id
            )
        if reply.kind == "decided":
            if decided is not None:
                broker.remembered_answers += 1
                broker.last_remembered_by = decision_setters(list(reply.records))
                return answered(decided, ", ".join(broker.last_remembered_by))
            # No trusted key signed what the lookup found for this request: a human answers, as a new request.
            broker._rejected(self.request_id, "a remembered decision", "asking a human instead")
            self.request_id = broker._request_ids.next()
            self.routing = dataclasses.replace(self.routing, lookup=False)
            self._to(AskState.ASKED)
            return await self.remote()
        checked = self._checked
        return _settled(outcome, checked[1] if checked is not None and checked[0] is outcome else None)

    def accepts(self, outcome: str, request_id: str | None = None) -> bool:
        """Whether ``outcome`` may end this ask: an error may; an answer only when sealed for this request.

        ``request_id``: the request it would end (a keyed ask's re-attach names another than its own).
        """
        broker = self.broker
        request_id = request_id or self.request_id
        try:
            decoded = decode_outcome(outcome)
        except msgspec.DecodeError:
            broker._rejected(request_id, "an outcome that does not decode")
            return False
        if decoded.answer is None:
            self._checked = (outcome, decoded)
            return True  # forging an error ends the ask, as withdrawing it would (docs/security.md)
        if decoded.proof is None or decoded.signed is None:
            broker._rejected(request_id, "an unsigned answer")
            return False
        durable = self.durable
        if not broker.trusted_keys.verify_outcome(
            namespace=broker.namespace,
            request_id=request_id,
            request_sha=self.request_sha,
            agent=self.request.agent or "",
            # A keyed request may have been shown to the provider under another process of its agent.
            client=None if durable is not None else broker.client_id,
            body=decoded.signed,
            proof=decoded.proof,
            durable=durable.key if durable is not None else "",
            settled_after=self.settled_after,
        ):
            broker._rejected(request_id, "an answer")
            return False
        self._checked = (outcome, decoded)
        return True

    def _verified_decision(self, reply: Asked) -> AskUserQuestionAnswer | None:
        broker = self.broker
        return verified_decisions(
            broker.trusted_keys, broker.namespace, self.request, list(reply.records), reply.now_ms
        )

    async def _ask_keyed(self, timeout_ms: str) -> Asked | Refusal:
        """ask.lua for a keyed ask: a new request, or the key's own one re-attached.

        The durable key is read first (a script may touch only the keys it is given); the
        script refuses with 'retry' when it changed meanwhile. Both possible request ids are
        awaited before the script runs, so a notice arriving just after it is never missed.
        """
        broker = self.broker
        inbox = broker._inbox
        assert inbox is not None and self.durable is not None
        durable_key = broker.keys.durable(self.request.agent, self.durable.key)
        # The key names a request through a value the asking side can rewrite: an outcome counts
        # only if it was sealed since this ask could have been waiting for it (its keep: the result
        # TTL or the detach grace, whichever is longer; 10 s of slack for the provider's clock).
        seconds, micros = await broker.commands.call("TIME")
        keep_ms = max(int(broker._provider_settings.result_ttl * 1000), self.durable.grace_ms) + 10_000
        self.settled_after = int(seconds) * 1000 + int(micros) // 1000 - keep_ms
        for _ in range(_ATTACH_TRIES):
            named: str | None = await broker.commands.call("GET", durable_key)
            if named is not None and named in broker._asks:
                raise UserQuestionError(f"key {self.durable.key!r} is being asked already by this process", BAD_REQUEST)
            attach = None if named is None else inbox.expect(named)
            if named is not None:
                broker._attaching[named] = self  # a notice for it meanwhile is checked as this ask's
            try:
                reply = await ask_script(
                    broker,
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
                    broker._attaching.pop(named, None)
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
                del broker._asks[self.request_id]
                self.request_id, self.future = named, attach
                broker._asks[named] = self
                self._to(AskState.REATTACHED)
                if reply.kind == "attached" and reply.value and reply.value != broker.client_id:
                    self._tell_replaced(reply.value)
            elif named is not None:
                inbox.forget(named)
            return reply
        raise UserQuestionError(
            f"key {self.durable.key!r} changed hands {_ATTACH_TRIES} times while asking", BROKER_UNAVAILABLE
        )

    def _tell_replaced(self, client_id: str) -> None:
        """End the wait of the process this ask re-attached from, should it still wait (a paused one)."""
        keys = self.broker.keys
        error = UserQuestionError("another process re-attached to this keyed question", CALLER_NOT_LIVE).to_payload()
        # '~': an ending for a waiter only; the receiver never cleans the request up on it.
        notice = f"{self.request_id} ~{encode(Outcome(error=error)).decode()}"
        inbox = keys.inbox(client_id)
        self.broker._fire("RPUSH", inbox, notice)
        self.broker._fire("PEXPIRE", inbox, int(self.broker._provider_settings.result_ttl * 1000))

    async def _kept_outcome(self, state: str) -> str | None:
        """The outcome of a keyed request settled while its asker was away (None: not one to accept; wait)."""
        outcome: str | None = await self.broker.commands.call("GET", self.broker.keys.outcome(self.request_id))
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

    async def _detach(self, request_id: str) -> scripts.Reply:
        broker, keys = self.broker, self.broker.keys
        settings = broker._provider_settings
        return await scripts.detach(
            broker.commands,
            request=keys.request(request_id),
            requests=keys.requests,
            away=keys.away,
            asklog=keys.asklog,
            rid=request_id,
            client=broker.client_id,
            log_max=settings.audit_maxlen,
            result_ttl=int(settings.result_ttl * 1000),
        )

    async def _withdraw(self, future: asyncio.Future[str]) -> str | None:
        """Withdraw the request; if it was settled first, return that outcome instead."""
        settled = _outcome_of(future)
        if settled is not None:
            return settled
        broker = self.broker
        keys = broker.keys
        if self.durable is not None and self.attached_unsure is not None:
            await self._detach(self.attached_unsure)
        if self.durable is not None and self.withdrawal == "withdrawn":
            # A keyed ask is given up only by an abort or a timeout; otherwise it is detached.
            detached = await self._detach(self.request_id)
            if detached.kind != "settled":
                self._to(AskState.DETACHED)
                return _outcome_of(future)
            outcome_key = keys.outcome(self.request_id)
            outcome: str | None = await broker.commands.call("GET", outcome_key)
            return outcome if outcome is not None and self.accepts(outcome) else _outcome_of(future)
        withdrawn = await scripts.withdraw(
            broker.commands,
            request=keys.request(self.request_id),
            requests=keys.requests,
            asklog=keys.asklog,
            rid=self.request_id,
            state=self.withdrawal,
            reason=f"the asker {self.withdrawal}",
            group="providers",
            log_max=broker._provider_settings.audit_maxlen,
        )
        if withdrawn.kind != "settled":
            return _outcome_of(future)
        outcome_key = keys.outcome(self.request_id)
        outcome = await broker.commands.call("GET", outcome_key)
        if outcome is None or not self.accepts(outcome):
            return _outcome_of(future)  # the inbox waiter took the outcome meanwhile
        commands = broker._open_commands
        if commands is not None:
            cleanup = [keys.request(self.request_id), outcome_key]
            scripts.settled_cleanup(commands, settled=cleanup, tombstone=TOMBSTONE_MS, client=broker.client_id)
        return outcome


def _follower(future: asyncio.Future[str]) -> asyncio.Future[str]:
    """A future that takes ``future``'s result or error; cancelling it leaves ``future`` be.

    ``asyncio.shield`` without its second callback and two closures: a third of a kilobyte less per waiting ask.
    """
    follower: asyncio.Future[str] = future.get_loop().create_future()
    future.add_done_callback(functools.partial(_pass_on, follower))
    return follower


def _pass_on(follower: asyncio.Future[str], future: asyncio.Future[str]) -> None:
    if follower.done():  # its waiter was cancelled
        return
    if future.cancelled():
        follower.cancel()
    elif (error := future.exception()) is not None:
        follower.set_exception(error)
    else:
        follower.set_result(future.result())


def _outcome_of(future: asyncio.Future[str]) -> str | None:
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return None


def _settled(outcome: str, verified: Outcome | None = None) -> AskUserQuestionAnswer:
    """The answer an outcome holds, or its error raised (``verified``: ``outcome`` as ``accepts`` decoded and
    verified it; only then does the answer name who answered, as its seal says)."""
    decoded = verified if verified is not None else decode_outcome(outcome)
    if decoded.error is not None:
        raise UserQuestionError.from_payload(decoded.error)
    if decoded.answer is None:
        raise UserQuestionError("the outcome holds neither an answer nor an error", BROKER_UNAVAILABLE)
    if verified is None or verified.proof is None:
        return decoded.answer
    return answered(decoded.answer, verified.proof.by)
