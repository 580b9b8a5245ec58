"""The broker: ``ask()`` for agents, ``provider()`` for UIs, over one Redis namespace."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import hiredis
import msgspec
from redis.asyncio import Connection, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

from ._commands import SCRIPTS, Commands
from ._inbox import Inbox
from ._keys import Keys
from .agents import Agent
from .connection import redis_from_url
from .errors import (
    ASK_ABORTED,
    ASK_TIMED_OUT,
    BROKER_UNAVAILABLE,
    CALLER_NOT_LIVE,
    EMPTY_QUESTIONS,
    UserQuestionError,
)
from .provider import Provider, ProviderSettings, acquire_lease, ensure_group, release_lease
from .types import AskUserQuestionAnswer, AskUserQuestionRequest, decode_outcome, encode
from .validation import Limits, check_answer, check_request

__all__ = ["Answerer", "Broker", "Next"]

log = logging.getLogger(__name__)

Next = Callable[[], Awaitable[AskUserQuestionAnswer]]
Answerer = Callable[[AskUserQuestionRequest, Next], Awaitable[AskUserQuestionAnswer]]
_Withdrawal = Literal["withdrawn", "aborted", "timed_out"]
_REDIS_DOWN = (ConnectionError, TimeoutError, OSError)


@dataclass(frozen=True)
class _Registration:
    answerer: Answerer
    agent_id: str | None


class _HiredisPackingConnection(Connection):
    """redis-py's asyncio connection packs commands in Python; hiredis does it in C.

    Packing was the largest single cost of a busy provider in the benchmark's profile.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        return [hiredis.pack_command(args)]


def redis_client(url: str, name: str | None = None, *, socket_timeout: float | None = None) -> Redis:
    """A client that reconnects with backoff; scripts are idempotent, so retries are safe.

    ``socket_timeout`` bounds a reply's wait, so a hung (paused) Redis is noticed; a client
    for blocking commands needs it longer than its longest block.
    """
    client: Redis = Redis.from_url(
        url,
        client_name=name,
        socket_timeout=socket_timeout,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=8),
        retry_on_error=[ConnectionError, TimeoutError],
        socket_connect_timeout=5.0,
        socket_keepalive=True,
    )
    if url.startswith("redis://"):  # TLS and socket URLs keep their own connection classes
        client.connection_pool.connection_class = _HiredisPackingConnection
    return client


def _client_for(url: str, name: str, *, socket_timeout: float | None = None) -> Redis:
    """A plain ``redis://`` URL gets the tuned client; TLS, Cluster and Sentinel URLs the
    matching one from ``broker.connection``."""
    if url.startswith("redis://"):
        return redis_client(url, name, socket_timeout=socket_timeout)
    return cast(Redis, redis_from_url(url, name=name))


class Broker:
    """Agents ask through it; providers answer through it. An async context manager."""

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        namespace: str = "default",
        *,
        lease_ttl: float = 10.0,
        agent_ttl: float = 15.0,
        client_ttl: float = 15.0,
        request_ttl: float = 86_400.0,
        result_ttl: float = 600.0,
        audit_maxlen: int = 10_000,
        dead_maxlen: int = 10_000,
        unavailable_after: float = 30.0,
        limits: Limits | None = None,
        connect: Callable[[], Redis] | None = None,
    ) -> None:
        self.keys = Keys(namespace)
        self.namespace = namespace
        self.lease_ttl = lease_ttl
        self.agent_ttl = agent_ttl
        self.client_ttl = client_ttl
        self.request_ttl = request_ttl
        self.limits = limits or Limits()
        self.client_id = secrets.token_hex(8)
        self.unavailable_after = unavailable_after
        name = f"qb-{self.client_id}"
        self._connect_commands = connect or (lambda: _client_for(url, name, socket_timeout=10.0))
        # No socket timeout on blocking reads: with one, redis-py's read timeout swallowed the
        # cancellation of a blocked XREADGROUP (seen on Python 3.11), so a provider never stopped.
        self._connect = connect or (lambda: _client_for(url, name))
        self._provider_settings = ProviderSettings(
            lease_ttl=lease_ttl,
            result_ttl=result_ttl,
            audit_maxlen=audit_maxlen,
            dead_maxlen=dead_maxlen,
            limits=self.limits,
        )
        self._answerers: list[_Registration] = []
        self._agents: dict[str, Agent] = {}
        self._stack: AsyncExitStack | None = None
        self._cleanups: set[asyncio.Task[Any]] = set()
        self._commands: Commands | None = None
        self._inbox: Inbox | None = None

    def __repr__(self) -> str:  # the URL may carry a password
        return f"Broker(namespace={self.namespace!r}, client_id={self.client_id!r})"

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Broker:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            client = self._connect_commands()
            stack.push_async_callback(client.aclose)
            blocking = self._connect()
            stack.push_async_callback(blocking.aclose)
            self._commands = Commands(client)
            self._inbox = Inbox(
                keys=self.keys,
                client_id=self.client_id,
                commands=self._commands,
                blocking=blocking,
                liveness_ttl=self.client_ttl,
                unavailable_after=self.unavailable_after,
            )
            tasks = await stack.enter_async_context(asyncio.TaskGroup())
            stack.callback(self._commands.fail_pending)
            sender = tasks.create_task(self._commands.run(), name="qb-commands")
            waiter = tasks.create_task(self._inbox.run(), name="qb-inbox")
            stack.callback(sender.cancel)
            stack.callback(waiter.cancel)
            await self._inbox.beat()
            await ensure_group(self._commands, self.keys)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            # Withdrawals in flight and queued clean-ups (an answered request's keys) finish first.
            if self._cleanups:
                await asyncio.wait(self._cleanups, timeout=5.0)
            if self._commands is not None:
                await asyncio.wait_for(self._commands.drain(), timeout=5.0)
        except TimeoutError:
            log.warning("closing with Redis commands unsent; their keys expire by TTL")
        finally:
            await stack.aclose()

    def track(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run clean-up work that must finish even if its caller is cancelled; awaited on close."""
        task = asyncio.ensure_future(work)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return task

    @property
    def commands(self) -> Commands:
        if self._commands is None or self._stack is None:
            raise UserQuestionError("the broker is not open: use `async with Broker(...)`", BROKER_UNAVAILABLE)
        return self._commands

    # -- agents ---------------------------------------------------------------------

    @asynccontextmanager
    async def agent(self, agent_id: str, owner: Agent | str | None = None) -> AsyncIterator[Agent]:
        """Register a live agent instance for the block; ``owner`` makes it an owned child."""
        owner_id = owner.id if isinstance(owner, Agent) else owner
        agent = Agent(self, agent_id, owner_id)
        commands = self.commands
        reply = await agent.register(commands, self.keys, self.agent_ttl)
        if reply[0] != "ok":
            raise UserQuestionError(reply[2], reply[1])
        self._agents[agent_id] = agent
        try:
            async with _running(agent.heartbeat(commands, self.keys, self.agent_ttl)):
                yield agent
        finally:
            if self._agents.get(agent_id) is agent:
                del self._agents[agent_id]
            try:
                await agent.remove(commands, self.keys)
            except _REDIS_DOWN as error:
                log.warning("could not remove agent %s: %s (its record expires)", agent_id, error)

    # -- the waterfall --------------------------------------------------------------

    def on_request(
        self, answerer: Answerer, *, agent: Agent | str | None = None, prepend: bool = False
    ) -> Callable[[], None]:
        """Add an answerer to this process's waterfall; returns its disposer."""
        registration = _Registration(answerer, agent.id if isinstance(agent, Agent) else agent)
        if prepend:
            self._answerers.insert(0, registration)
        else:
            self._answerers.append(registration)

        def dispose() -> None:
            if registration in self._answerers:
                self._answerers.remove(registration)

        return dispose

    # -- asking ---------------------------------------------------------------------

    async def ask(
        self,
        request: AskUserQuestionRequest,
        *,
        abort: asyncio.Event | None = None,
        timeout: float | None = None,
    ) -> AskUserQuestionAnswer:
        """Ask a human; ``request.agent`` must name an agent registered by this broker."""
        agent = self._agents.get(request.agent) if request.agent is not None else None
        return await self._ask(request, agent, abort, timeout)

    async def ask_as(
        self,
        agent: Agent,
        request: AskUserQuestionRequest,
        *,
        abort: asyncio.Event | None = None,
        timeout: float | None = None,
    ) -> AskUserQuestionAnswer:
        if request.agent != agent.id:
            request = msgspec.structs.replace(request, agent=agent.id)
        return await self._ask(request, agent, abort, timeout)

    async def _ask(
        self,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        abort: asyncio.Event | None,
        timeout: float | None,
    ) -> AskUserQuestionAnswer:
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        if abort is not None and abort.is_set():
            raise UserQuestionError("the ask was aborted before it started", ASK_ABORTED)
        if not request.questions:
            raise UserQuestionError("the request has no questions", EMPTY_QUESTIONS)
        if request.agent is not None and (agent is None or not agent.alive):
            raise UserQuestionError(f"agent {request.agent!r} is not a live instance here", CALLER_NOT_LIVE)
        try:
            check_request(request, self.limits)
            problem = None
        except UserQuestionError as error:
            problem = error
        answerers = [r.answerer for r in self._answerers if r.agent_id in (None, request.agent)]
        if agent is not None and (problem is not None or answerers):
            await self._gate(request, agent)  # the seeds' order: the caller gate first
        if problem is not None:
            raise problem

        ask = _Ask(self, request, agent, deadline)
        if not answerers and abort is None and deadline is None:
            return await ask.remote()
        return await ask.run(answerers, abort, deadline)

    async def _gate(self, request: AskUserQuestionRequest, agent: Agent) -> None:
        reply = await self._script("ask", request, agent, "", gate_only=True)
        if reply[0] != "ok":
            raise UserQuestionError(reply[2], reply[1])

    async def _script(
        self,
        name: str,
        request: AskUserQuestionRequest,
        agent: Agent | None,
        request_id: str,
        *,
        gate_only: bool = False,
        timeout_ms: str = "",
    ) -> Any:
        keys = self.keys
        request_key = keys.request(request_id)
        return await self.commands.script(
            SCRIPTS[name],
            [
                keys.requests,
                request_key,
                keys.agent(agent.id) if agent is not None else request_key,
                keys.provider,
                keys.standbys,
                keys.audit,
            ],
            [
                request_id,
                b"" if gate_only else encode(request),
                agent.id if agent is not None else "",
                agent.token if agent is not None else "",
                self.client_id,
                int(self.request_ttl * 1000),
                self._provider_settings.audit_maxlen,
                timeout_ms,
                "1" if gate_only else "0",
                agent.fingerprint if agent is not None else "",
            ],
        )

    # -- providing ------------------------------------------------------------------

    @asynccontextmanager
    async def provider(
        self, name: str, *, standby: bool = True, on_standby: Callable[[str], Any] | None = None
    ) -> AsyncIterator[Provider]:
        """Hold the namespace's provider lease for the block (waiting for it when ``standby``)."""
        commands = self.commands
        blocking = self._connect()
        try:
            token, epoch = await acquire_lease(
                commands=commands,
                blocking=blocking,
                keys=self.keys,
                name=name,
                lease_ttl=self.lease_ttl,
                standby=standby,
                on_standby=on_standby,
            )
            provider = Provider(
                keys=self.keys,
                name=name,
                token=token,
                epoch=epoch,
                commands=commands,
                blocking=blocking,
                settings=self._provider_settings,
            )
            log.info("provider %s holds the lease of %s (epoch %d)", name, self.namespace, epoch)
            try:
                async with _running(provider.keep_lease(), provider.read()):
                    yield provider
            finally:
                try:
                    await release_lease(commands, self.keys, provider)
                except _REDIS_DOWN as error:
                    log.warning("could not release the lease: %s (it lapses after its TTL)", error)
        finally:
            await blocking.aclose()


@asynccontextmanager
async def _running(*work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run background work for the block; cancel and await it on the way out.

    Not a TaskGroup: that would wrap whatever the caller's block raises in an ExceptionGroup.
    """
    tasks = [asyncio.ensure_future(coroutine) for coroutine in work]
    for task in tasks:
        task.add_done_callback(_log_crash)
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_coro(), exc_info=task.exception())


class _Ask:
    """One ask in flight: enqueue, wait, and withdraw on every way out."""

    def __init__(
        self, broker: Broker, request: AskUserQuestionRequest, agent: Agent | None, deadline: float | None
    ) -> None:
        self.broker = broker
        self.request = request
        self.agent = agent
        self.deadline = deadline
        self.request_id = secrets.token_hex(12)
        self.withdrawal: _Withdrawal = "withdrawn"

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
        return check_answer(self.request, answer, self.broker.limits)

    async def remote(self) -> AskUserQuestionAnswer:
        """The end of the chain: enqueue for the namespace's provider and wait."""
        broker = self.broker
        inbox = broker._inbox
        assert inbox is not None
        future = inbox.expect(self.request_id)
        try:
            try:
                timeout_ms = ""
                if self.deadline is not None:
                    remaining = self.deadline - asyncio.get_running_loop().time()
                    timeout_ms = str(max(1, int(remaining * 1000)))
                reply = await broker._script("ask", self.request, self.agent, self.request_id, timeout_ms=timeout_ms)
                if reply[0] != "ok":
                    raise UserQuestionError(reply[2], reply[1])
                # Shielded: cancelling this task must not cancel the future the inbox resolves.
                outcome = await asyncio.shield(future)
            except asyncio.CancelledError:
                # Shielded in a task of the broker's: a caller that keeps cancelling (an anyio
                # cancel scope does) must not stop the withdrawal half-way.
                settled = await asyncio.shield(broker.track(self._withdraw(future)))
                if settled is None:
                    raise
                outcome = settled
        except _REDIS_DOWN as error:
            raise UserQuestionError(f"Redis is unreachable: {error}", BROKER_UNAVAILABLE) from error
        finally:
            inbox.forget(self.request_id)
        return _settled(outcome)

    async def _withdraw(self, future: asyncio.Future[str]) -> str | None:
        """Withdraw the request; if it was settled first, return that outcome instead."""
        if future.done() and not future.cancelled():
            return future.result()
        broker = self.broker
        keys = broker.keys
        reply = await broker.commands.script(
            SCRIPTS["withdraw"],
            [keys.request(self.request_id), keys.requests, keys.audit],
            [
                self.request_id,
                self.withdrawal,
                f"the asker {self.withdrawal}",
                "providers",
                broker._provider_settings.audit_maxlen,
            ],
        )
        if reply[0] != "settled":
            return future.result() if future.done() and not future.cancelled() else None
        outcome_key = keys.outcome(self.request_id)
        outcome: str | None = await broker.commands.call("GET", outcome_key)
        if outcome is None and future.done() and not future.cancelled():
            return future.result()  # the inbox waiter took the outcome meanwhile
        await broker.commands.call("UNLINK", outcome_key, keys.request(self.request_id))
        return outcome


def _settled(outcome: str) -> AskUserQuestionAnswer:
    decoded = decode_outcome(outcome)
    if decoded.error is not None:
        raise UserQuestionError.from_payload(decoded.error)
    if decoded.answer is None:
        raise UserQuestionError("the outcome holds neither an answer nor an error", BROKER_UNAVAILABLE)
    return decoded.answer
