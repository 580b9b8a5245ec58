"""Live agent instances: who may ask a human at all.

Each registering process holds an unguessable token; Redis keeps only its SHA-1 fingerprint in
the agent record, so the token goes from the agent to Redis in an ask and nowhere else (not to
providers, UIs, logs or the audit stream).

The record is the agent id's live instance, shared by its processes: several processes (shell
steps, workers) registered under one id join it and ask at once, none superseding another. A
restart (``Broker.agent(..., restart=True)``, ``qbroker ask --restart``), or registering under
another owner, starts a new instance and supersedes every process registered before it, as the
seeds require of a restarted agent. A process whose entry lapsed while it lived (a Redis restart
that outlasted the TTL, a pause) puts itself back; only a restart supersedes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from typing import TYPE_CHECKING

from .._commands import Commands
from .._keys import Keys
from .._redis_errors import is_transient
from .._scripts import Refusal, agent_heartbeat, agent_register
from ..attachments import write_attachment
from ._call import ask, for_agent
from ._core import AskingCore

if TYPE_CHECKING:
    from typing import Unpack

    from ..types import AskUserQuestionAnswer, AskUserQuestionRequest
    from .options import AskOptions

__all__ = ["Agent"]

log = logging.getLogger(__name__)


class Agent:
    """A registered, heart-beating agent instance; ask through it to ask as it."""

    def __init__(self, core: AskingCore, agent_id: str, owner: str | None, *, restart: bool = False) -> None:
        self._core = core
        self.id = agent_id
        self.owner = owner
        self.restart = restart
        """this registration starts a new instance of the id, superseding every earlier process"""
        self._token = secrets.token_urlsafe(32)
        self._fingerprint = hashlib.sha1(self._token.encode()).hexdigest()
        self._registered = "0"
        """when this process registered (Redis ms): a restart after it supersedes it"""
        self.alive = False
        """False once a restart of the id superseded this process, or its heartbeats failed for a whole TTL"""
        self.superseded = False
        """True once this process learnt that a new instance of the id superseded it (said once, in the log)"""

    def __repr__(self) -> str:  # the token stays out of reprs and logs
        return f"Agent(id={self.id!r}, owner={self.owner!r}, alive={self.alive})"

    @property
    def token(self) -> str:
        """The instance's secret capability; sent to Redis only, inside an ask."""
        return self._token

    @property
    def fingerprint(self) -> str:
        """SHA-1 of the token: what the agent record holds in its place."""
        return self._fingerprint

    async def ask(self, request: AskUserQuestionRequest, **options: Unpack[AskOptions]) -> AskUserQuestionAnswer:
        """Ask as this exact instance (``request.agent`` is set to this agent's id); ``options`` as ``Broker.ask``'s."""
        waiting = ask(self._core, for_agent(request, self), self, options)
        del request, options  # not kept while the ask waits (a waiting ask's memory counts, docs/operations.md)
        return await waiting

    async def attach(self, text: str) -> str:
        """``Broker.attach``: keep a text a question names by its SHA-256 (the digest returned)."""
        core = self._core
        return await write_attachment(core.commands, core.keys, text, core.settings.request_ttl)

    async def register(self, commands: Commands, keys: Keys, ttl: float) -> Refusal | None:
        """Add this process to the agent's record; the refusal when the script refused it."""
        registered = await agent_register(
            commands,
            record=keys.agent(self.id),
            owner_record=keys.agent(self.owner) if self.owner else keys.agent(self.id),
            agents=keys.agents,
            fingerprint=self._fingerprint,
            owner=self.owner or "",
            ttl=int(ttl * 1000),
            check_owner="1" if self.owner else "0",
            agent=self.id,
            mode="restart" if self.restart else "join",
        )
        if isinstance(registered, Refusal):
            self.alive = False
            return registered
        self.alive = True
        self._registered = str(registered)
        return None

    async def heartbeat(self, commands: Commands, keys: Keys, ttl: float) -> None:
        """Refresh this process's entry every third of its TTL until cancelled or superseded.

        While no heartbeat succeeds for a whole TTL the entry may have lapsed, so the agent
        counts as not alive (its asks fail ``CALLER_NOT_LIVE`` at once) until one succeeds: the
        one that succeeds puts the entry (and the record) back if it lapsed meanwhile.
        """
        loop = asyncio.get_running_loop()
        valid_until = loop.time() + ttl
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                held = await self._beat(commands, keys, int(ttl * 1000))
            except Exception as error:
                log.log(
                    logging.WARNING if is_transient(error) else logging.ERROR,
                    "agent %s heartbeat failed: %r",
                    self.id,
                    error,
                )
                if self.alive and loop.time() >= valid_until:
                    log.warning("agent %s missed its heartbeats for %.0fs: not live until one succeeds", self.id, ttl)
                    self.alive = False
                continue
            if not held:
                self._learn_superseded()
                return
            self.alive = True
            valid_until = loop.time() + ttl

    async def revive(self) -> bool:
        """The caller gate refused this live process (its record lapsed in Redis: a restart that kept no data, a
        pause past its TTL): put it back now, as its next heartbeat would, rather than fail asks until then.
        False when it is not live here, or a restart of the id superseded it (the gate's refusal then stands)."""
        if not self.alive:
            return False
        core = self._core
        if await self._beat(core.commands, core.keys, int(core.settings.agent_ttl * 1000)):
            return True
        self._learn_superseded()
        return False

    async def _beat(self, commands: Commands, keys: Keys, ttl_ms: int | str) -> bool:
        """One heartbeat (``ttl_ms`` '0': this process leaves the record): False once a restart of the id
        superseded this process."""
        return await agent_heartbeat(
            commands,
            record=keys.agent(self.id),
            agents=keys.agents,
            fingerprint=self._fingerprint,
            ttl=ttl_ms,
            agent=self.id,
            registered=self._registered,
            owner=self.owner or "",
        )

    async def remove(self, commands: Commands, keys: Keys) -> None:
        self.alive = False
        held = await self._beat(commands, keys, "0")
        if not held:  # superseded before any heartbeat saw it (its asks withdrawn at once): say so now
            self._learn_superseded()

    def _learn_superseded(self) -> None:
        self.alive = False
        if self.superseded:
            return
        self.superseded = True
        # Whole, and naming the next step: a person reads it in a terminal, `qbroker ask`'s stderr.
        log.warning(
            "agent %s was restarted by another process (restart=True, `qbroker ask --restart`, or registering "
            "under another owner): this process is superseded, so its questions are withdrawn and it cannot ask "
            "again; to ask as %s, register without restart: `qbroker ask --agent %s` without --restart joins "
            "the new instance",
            self.id,
            self.id,
            self.id,
        )
