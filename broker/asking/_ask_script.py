"""One call of ask.lua: the caller gate, and the enqueue of an ask (or its re-attach, or a remembered decision)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

from .._scripts import AskArgv, Asked, AskEnqueue, AskKeys, Refusal
from .._scripts import ask as ask_lua
from ..decisions import decision_keys
from ..errors import CALLER_NOT_LIVE
from ..types import AskUserQuestionRequest, encode
from ._core import AskingCore, Caller
from .options import DEFAULT_ROUTING, Durable, Routing

__all__ = ["ask_script", "asked", "gate"]


async def ask_script(
    core: AskingCore,
    request: AskUserQuestionRequest,
    agent: Caller | None,
    request_id: str,
    *,
    gate_only: bool = False,
    timeout_ms: str = "",
    durable: Durable | None = None,
    named: str | None = None,
    routing: Routing = DEFAULT_ROUTING,
    wire: bytes | None = None,
) -> Asked | Refusal:
    """Run ask.lua; a keyed ask names the durable key's request as it read it (``named``)."""
    body = wire if wire is not None else encode(request)
    keys = core.keys
    request_key = keys.request(request_id)
    found = decision_keys(keys, request) if routing.remember and routing.lookup and not gate_only else []
    looked_up = len(found) // 2
    attest = None
    attest_key = core.trust.attest_key
    if not gate_only and attest_key is not None and agent is not None:  # checked by the provider
        attest = attest_key.attest(
            namespace=core.settings.namespace,
            request_id=request_id,
            request_sha=hashlib.sha256(body).hexdigest(),
            agent=agent.id,
            client=core.client_id,
        )
    return await ask_lua(
        core.commands,
        keys=AskKeys(
            requests=keys.requests,
            request=request_key,
            record=keys.agent(agent.id) if agent is not None else request_key,
            asklog=keys.asklog,
            durable=keys.durable(request.agent, durable.key) if durable is not None else request_key,
            named=keys.request(named) if named else request_key,
        ),
        argv=AskArgv(
            rid=request_id,
            body=b"" if gate_only else body,
            agent=agent.id if agent is not None else "",
            token=agent.token if agent is not None else "",
            client=core.client_id,
            request_ttl=int(core.settings.request_ttl * 1000),
            log_max=core.settings.audit_maxlen,
            timeout=timeout_ms,
            gate_only="1" if gate_only else "0",
            token_sha=agent.fingerprint if agent is not None else "",
            key=durable.key if durable is not None else "",
            grace=durable.grace_ms if durable is not None else 0,
            digest=durable.digest(body) if durable is not None else "",
        ),
        enqueue=None
        if gate_only
        else AskEnqueue(
            outcome=keys.outcome(request_id),
            away=keys.away,
            solo="" if routing.coalesce else "solo",
            remember=("1" if routing.lookup else "x") if routing.remember else "0",
            result_ttl=int(core.settings.result_ttl * 1000),
            lease=keys.provider,  # read-only keys come in ARGV (broker/roles.py: the asker may only read them)
            standbys=keys.standbys,
            questions=[item.id for item in request.questions[:looked_up]] if looked_up else (),
            decision_keys=found,
            attest=attest,
        ),
    )


async def gate(core: AskingCore, request: AskUserQuestionRequest, agent: Caller) -> None:
    """The seeds' caller gate alone (a live, unowned instance), before an answerer or a bad request is told."""
    await asked(agent, lambda: ask_script(core, request, agent, "", gate_only=True))


async def asked(agent: Caller | None, send: Callable[[], Awaitable[Asked | Refusal]]) -> Asked:
    """``send``'s reply, an ask.lua call; a refusal raised. When the gate refused a live asker whose record Redis
    lost (a restart that kept no data, a pause past the TTL), the asker is put back and ``send`` runs once more:
    it is live, and its next heartbeat would put it back anyway (a refusal changed nothing: the second call is the
    first that counts)."""
    reply = await send()
    if isinstance(reply, Refusal) and reply.code == CALLER_NOT_LIVE and agent is not None and await agent.revive():
        reply = await send()
    if isinstance(reply, Refusal):
        raise reply.error()
    return reply
