"""Asks on behalf of MCP clients: the broker, this process's agents, the asks in flight."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from redis.exceptions import ConnectionError, TimeoutError

from broker import Agent, AskUserQuestionAnswer, AskUserQuestionRequest, Broker, UserQuestionError
from broker.errors import ASK_TIMED_OUT, BROKER_UNAVAILABLE, NO_PROVIDER
from workers.asking.mcp.tool import ParsedCall, answer_result, error_result, parse_arguments

__all__ = ["AskService", "Caller", "derived_agent_id"]

log = logging.getLogger(__name__)

_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")
_REDIS_DOWN = (ConnectionError, TimeoutError, OSError)


def derived_agent_id(client_name: str | None) -> str:
    """``mcp-<client>-<random>``: unique per process, so two servers never evict each other."""
    slug = _SLUG.sub("-", client_name or "").strip("-")[:40] or "client"
    return f"mcp-{slug}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Caller:
    """The MCP side of one tool call: its client, and what that client can do while a human takes their time."""

    client_name: str | None = None
    report_progress: Callable[[float, float | None, str], Awaitable[None]] | None = None
    """send a progress notification (progress, total, message); None: the call asked for none"""
    elicit: Callable[[AskUserQuestionRequest], Awaitable[AskUserQuestionAnswer]] | None = None
    """ask the client's own user; None: the client cannot"""
    agent_id: str | None = None
    """the agent its bearer token names (HTTP with --tokens-file): it asks as that agent, whatever else is set"""


class AskService:
    """Asks on behalf of MCP clients; an async context manager that owns its tasks."""

    def __init__(
        self,
        broker: Broker | Callable[[], Broker],
        *,
        agent_id: str | None = None,
        default_timeout: float | None = None,
        withdraw_grace: float = 5.0,
        progress_interval: float = 10.0,
    ) -> None:
        # A callable gives the broker once it is open (it raises BROKER_UNAVAILABLE until then).
        self._broker = broker if callable(broker) and not isinstance(broker, Broker) else (lambda: broker)
        self.agent_id = agent_id
        self.default_timeout = default_timeout
        self.withdraw_grace = withdraw_grace
        self.progress_interval = progress_interval
        self._agents: dict[str, tuple[asyncio.Future[Agent], asyncio.Event]] = {}
        self._agent_ids: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._stack = AsyncExitStack()
        self._tasks: asyncio.TaskGroup | None = None

    async def __aenter__(self) -> AskService:
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._stack.callback(self._release_agents)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._tasks = None
        await self._stack.aclose()

    def _release_agents(self) -> None:
        for _ready, release in self._agents.values():
            release.set()

    @property
    def tasks(self) -> asyncio.TaskGroup:
        if self._tasks is None:
            raise UserQuestionError("the MCP service is not running", BROKER_UNAVAILABLE)
        return self._tasks

    async def agent_for(self, client_name: str | None, verified: str | None = None) -> Agent:
        """This process's live agent for the client: registered on first use, renewed if it lapsed.

        ``verified``: the agent a bearer token named, which wins over any configured or derived id.
        """
        async with self._lock:
            key = client_name or ""
            agent_id = verified or self.agent_id or self._agent_ids.setdefault(key, derived_agent_id(client_name))
            held = self._agents.get(agent_id)
            if held is not None:
                ready, release = held
                if not ready.done() or (not ready.cancelled() and ready.exception() is None and ready.result().alive):
                    return await asyncio.shield(ready)
                release.set()  # the old instance lapsed (or never registered): register a new one
            ready = asyncio.get_running_loop().create_future()
            release = asyncio.Event()
            self._agents[agent_id] = (ready, release)  # tracked before awaiting, so exit releases it
            self.tasks.create_task(self._hold(agent_id, ready, release), name=f"qb-mcp-agent-{agent_id}")
        agent = await asyncio.shield(ready)
        log.info("asking as agent %s", agent_id)
        return agent

    async def _hold(self, agent_id: str, ready: asyncio.Future[Agent], release: asyncio.Event) -> None:
        try:
            async with self._broker().agent(agent_id) as agent:
                ready.set_result(agent)
                await release.wait()
        except Exception as error:  # handed to the caller waiting for the registration
            if not ready.done():
                ready.set_exception(error)
            else:
                log.warning("agent %s ended: %s", agent_id, error)
        finally:
            if not ready.done():  # cancelled while registering: nobody waits forever
                ready.cancel()

    async def call(self, arguments: dict[str, Any] | None, caller: Caller | None = None) -> types.CallToolResult:
        """Run one tool call; cancelling it withdraws the question (detaches it, when keyed)."""
        caller = caller or Caller()
        try:
            parsed = parse_arguments(arguments)
            agent = await self.agent_for(caller.client_name, caller.agent_id)
        except UserQuestionError as error:
            return error_result(error)
        except _REDIS_DOWN as error:
            return error_result(UserQuestionError(f"Redis is unreachable: {error}", BROKER_UNAVAILABLE))
        timeout = parsed.timeout if parsed.timeout is not None else self.default_timeout
        task = self.tasks.create_task(self._ask(agent, parsed, timeout), name="qb-mcp-ask")
        try:
            outcome = await self._wait(task, timeout, caller)
        except BaseException:
            # The client cancelled the call or went away: one cancel of the ask task
            # withdraws the question; wait for that, shielded from the caller's own scope.
            task.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.withdraw_grace):
                await asyncio.wait({task})
            raise
        if isinstance(outcome, UserQuestionError) and outcome.code == NO_PROVIDER and caller.elicit is not None:
            outcome = await _elicited(caller.elicit, parsed.request, timeout)
        if isinstance(outcome, UserQuestionError):
            return error_result(outcome)
        return answer_result(outcome, parsed.generated)

    async def _wait(
        self, task: asyncio.Task[AskUserQuestionAnswer | UserQuestionError], limit_s: float | None, caller: Caller
    ) -> AskUserQuestionAnswer | UserQuestionError:
        """The ask's outcome; meanwhile a progress notification every ``progress_interval``, if asked for."""
        if caller.report_progress is None:
            return await asyncio.shield(task)
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            done, _ = await asyncio.wait({task}, timeout=self.progress_interval)  # never cancels the task
            if done:
                return task.result()
            waited = loop.time() - started
            try:
                await caller.report_progress(waited, limit_s, f"waiting for a human to answer ({waited:.0f} s)")
            except Exception as error:  # a client that cannot take it still gets its answer
                log.debug("progress notification failed: %r", error)

    async def _ask(
        self, agent: Agent, parsed: ParsedCall, limit_s: float | None
    ) -> AskUserQuestionAnswer | UserQuestionError:
        try:
            return await agent.ask(
                parsed.request, timeout=limit_s, key=parsed.key, remember=parsed.remember, coalesce=parsed.coalesce
            )
        except UserQuestionError as error:
            return error
        except _REDIS_DOWN as error:
            return UserQuestionError(f"Redis is unreachable: {error}", BROKER_UNAVAILABLE)
        except Exception as error:  # never let one ask take the service's task group down
            log.exception("ask failed")
            return UserQuestionError(f"the ask failed: {error!r}", BROKER_UNAVAILABLE)


async def _elicited(
    elicit: Callable[[AskUserQuestionRequest], Awaitable[AskUserQuestionAnswer]],
    request: AskUserQuestionRequest,
    limit_s: float | None,
) -> AskUserQuestionAnswer | UserQuestionError:
    """Nobody in the namespace can answer: ask the client's own user instead."""
    try:
        async with asyncio.timeout(limit_s):
            return await elicit(request)
    except UserQuestionError as error:
        return error
    except TimeoutError:
        return UserQuestionError("the user of the MCP client did not answer in time", ASK_TIMED_OUT)
    except Exception as error:  # the client refused or failed the elicitation: nobody could answer
        log.warning("elicitation failed: %r", error)
        return UserQuestionError(f"no provider runs, and the MCP client could not ask its user: {error}", NO_PROVIDER)
