"""One ask call: the request checked in the seeds' order, then one ``Ask``'s life (broker/asking/_ask.py).

``Broker.ask``, ``Broker.ask_as`` and ``Agent.ask`` each await what ``ask()`` returns: ``ask()`` itself is no
coroutine, for every coroutine between a waiting ask and its caller is a frame kept per waiting ask.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import msgspec
from redis.exceptions import RedisError

from .._redis_errors import unavailable
from ..errors import ASK_ABORTED, CALLER_NOT_LIVE, EMPTY_QUESTIONS, NO_TRUSTED_KEY, UserQuestionError
from ..types import AskUserQuestionAnswer, AskUserQuestionRequest
from ..validation import check_request
from ._ask import Ask
from ._ask_script import gate
from ._core import Answerer, AskingCore, Caller
from .options import AskOptions, plan

__all__ = ["ask", "for_agent"]


def for_agent(request: AskUserQuestionRequest, agent: Caller) -> AskUserQuestionRequest:
    """``request`` as ``agent`` asks it (its ``agent`` set to the instance's id)."""
    return request if request.agent == agent.id else msgspec.structs.replace(request, agent=agent.id)


def ask(
    core: AskingCore, request: AskUserQuestionRequest, agent: Caller | None, options: AskOptions
) -> Awaitable[AskUserQuestionAnswer]:
    """Check ``request`` (DESIGN.md, in the seeds' order); what to await to ask it: the waterfall, else the provider.

    Called by an ``ask`` coroutine as it runs, and awaited at once, so a check fails where the ask is awaited.
    With no answerers the wait is ``Ask.remote`` itself, raced there: one frame from the caller's ``ask`` to it.
    """
    durable, routing = plan(options, core.settings.detach_grace)
    abort, timeout = options.get("abort"), options.get("timeout")
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    if not core.trust.trusted_keys:
        raise UserQuestionError(
            "this asker trusts no answering key, so no answer could count: give it the providers' public key "
            "(qbroker: --trusted-keys-file FILE or QBROKER_TRUSTED_KEYS_FILE; Python: Broker(trusted_keys=...))",
            NO_TRUSTED_KEY,
        )
    if abort is not None and abort.is_set():
        raise UserQuestionError("the ask was aborted before it started", ASK_ABORTED)
    if not request.questions:
        raise UserQuestionError("the request has no questions", EMPTY_QUESTIONS)
    if request.agent is not None and (agent is None or not agent.alive):
        raise UserQuestionError(f"agent {request.agent!r} is not a live instance here", CALLER_NOT_LIVE)
    try:
        check_request(request, core.settings.limits)
        problem = None
    except UserQuestionError as error:
        problem = error
    answerers = core.answerers_for(request.agent)
    if problem is not None:
        return _waterfall(core, request, agent, problem, answerers, abort)
    one = Ask(core, request, agent, deadline, durable, routing)
    if not answerers:
        return one.remote(abort, whole=True)
    return _waterfall(core, request, agent, one, answerers, abort)


async def _waterfall(
    core: AskingCore,
    request: AskUserQuestionRequest,
    agent: Caller | None,
    one: Ask | UserQuestionError,
    answerers: list[Answerer],
    abort: asyncio.Event | None,
) -> AskUserQuestionAnswer:
    """The caller gate, then ``one`` asked through ``answerers`` (``one`` an error: the request's problem, raised
    once the gate let it through), raced against its deadline and ``abort`` as ``Ask.remote`` races its own wait."""
    try:
        if agent is not None:
            await gate(core, request, agent)  # the seeds' order: the caller gate first
        if isinstance(one, UserQuestionError):
            raise one
        one.arm(abort)
        try:
            answer = await one.waterfall(answerers, 0)
        except BaseException as error:
            instead = one.raced(error)
            if instead is None:
                raise
            raise instead from (None if isinstance(error, asyncio.CancelledError) else error)
        finally:
            one.end()
        one.raced(None)
        return answer
    except (RedisError, OSError) as error:  # a refusal no retry can mend (NOPERM, say)
        raise unavailable(error, "asking") from error
