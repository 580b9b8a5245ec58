"""The live agent records the gateway holds for the agents it asks for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from broker import Agent, Broker

__all__ = ["AgentRecords"]

log = logging.getLogger(__name__)


def _lapsed(ready: asyncio.Future[Agent]) -> bool:
    """A registration that failed, or an instance that is no longer the live one."""
    if not ready.done():
        return False
    return ready.cancelled() or ready.exception() is not None or not ready.result().alive


@dataclass(eq=False)
class _Hold:
    ready: asyncio.Future[Agent]
    release: asyncio.Event
    users: int = 0
    linger: asyncio.TimerHandle | None = None


class AgentRecords:
    """The live agent records the gateway holds: one per agent id while it has asks running.

    A record outlives its last ask by ``linger`` seconds: an agent asking one question at a time
    would otherwise pay a registration (a round trip) on every ask.
    """

    def __init__(self, broker: Broker, tasks: asyncio.TaskGroup, linger: float) -> None:
        self._broker = broker
        self._tasks = tasks
        self._linger = linger
        self._held: dict[str, _Hold] = {}
        self._holding: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def use(self, agent_id: str) -> AsyncIterator[Agent]:
        hold = self._held.get(agent_id)
        if hold is None or _lapsed(hold.ready):
            # Registered anew: a direct asker taking the id over makes the old record not live.
            hold = _Hold(asyncio.get_running_loop().create_future(), asyncio.Event())
            self._held[agent_id] = hold
            task = self._tasks.create_task(self._hold(agent_id, hold), name=f"qb-gateway-agent-{agent_id}")
            self._holding.add(task)
            task.add_done_callback(self._holding.discard)
        if hold.linger is not None:
            hold.linger.cancel()
            hold.linger = None
        hold.users += 1
        try:
            yield await asyncio.shield(hold.ready)
        finally:
            hold.users -= 1
            if hold.users == 0:
                hold.linger = asyncio.get_running_loop().call_later(self._linger, self._let_go, agent_id, hold)

    def _let_go(self, agent_id: str, hold: _Hold) -> None:
        hold.linger = None
        hold.release.set()
        if self._held.get(agent_id) is hold:
            del self._held[agent_id]

    async def _hold(self, agent_id: str, hold: _Hold) -> None:
        try:
            async with self._broker.agent(agent_id) as agent:
                hold.ready.set_result(agent)
                await hold.release.wait()
        except Exception as error:  # handed to the asks waiting for the registration
            if not hold.ready.done():
                hold.ready.set_exception(error)
            else:
                log.warning("agent %s ended: %r", agent_id, error)
        finally:
            if not hold.ready.done():
                hold.ready.cancel()

    def release_all(self) -> None:
        for hold in self._held.values():
            if hold.linger is not None:
                hold.linger.cancel()
            hold.release.set()

    def abandon_all(self) -> None:
        """Stop removing records (Redis does not answer): each expires with its TTL."""
        for task in self._holding:
            task.cancel()
