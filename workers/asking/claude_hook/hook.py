"""The engine of ``qbroker claude-hook``: a Claude Code hook that asks the namespace's provider.

Input (stdin): a Claude Code hook payload. Two events are asked about:

- ``PermissionRequest`` (the documented one): Claude Code is about to show its permission dialog,
  so the user's allow/deny/ask rules and permission mode have already been applied. Any tool.
- ``PreToolUse``, for ``AskUserQuestion`` and ``ExitPlanMode`` only: tools that wait for the user
  whatever the permission rules say, answered through ``updatedInput``.

Output (stdout, exit status 0): the event's own decision shape; nothing at all for any other event
(or a PreToolUse of another tool, or a payload it cannot read): Claude Code then goes on as it
would without the hook. The mapping:

- the human's answer decides (``workers.asking.claude_hook.questions``): allow (with ``updatedInput`` /
  ``updatedPermissions``) or deny with a reason Claude reads;
- the human (or a rule) cancels the question (``ASK_CANCELLED``): deny with its reason;
- nobody can answer (``NO_PROVIDER``, ``ASK_TIMED_OUT``, ``BROKER_UNAVAILABLE``) or the human skips
  it: Claude Code asks locally (PermissionRequest: no decision and a ``systemMessage``; PreToolUse:
  ``ask``), or deny with ``--on-unavailable deny``.

The local user answers too, first answer wins: while the hook waits, Claude Code's own dialog
decides the call if the user answers there first (``workers.asking.claude_hook.local`` notices
and withdraws the team's question); ``--local-grace`` hands a call nobody on the team answered
back to Claude Code's dialog.

Every call of one session asks as one agent, ``claude-code-<session_id>`` (a subagent's calls too: an
owned agent may not ask a human), keyed per tool call: by its ``tool_use_id`` (PreToolUse), or for a
PermissionRequest (which carries none) by the id of its ``tool_use`` in the session's transcript. So a hook
run again for the same call (killed, restarted) re-attaches to its question, and a later identical call is
a question of its own: one approval, one call. A call with no identity to be found (no transcript, a
subagent's call, two identical calls waiting at once) is asked unkeyed, never under a digest of the call:
its answer goes to this run alone, and a hook killed without a word leaves nothing to re-attach to (its
card comes down once its liveness lapses).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Mapping
from typing import Any, Final

import msgspec
from redis.exceptions import RedisError

from broker import AskUserQuestionAnswer, UserQuestionError
from broker.errors import ASK_CANCELLED, BROKER_UNAVAILABLE, NO_PROVIDER
from workers.asking.claude_hook.local import Transcript
from workers.asking.claude_hook.questions import Asking, HookPayload, Verdict, asking_for, shows_whole
from workers.settings import Settings

__all__ = ["ASKED_BEFORE_USE", "agent_id_for", "hook", "hook_output", "is_headless", "key_for"]

PERMISSION_REQUEST: Final = "PermissionRequest"
PRE_TOOL_USE: Final = "PreToolUse"
ASKED_BEFORE_USE: Final = frozenset({"AskUserQuestion", "ExitPlanMode"})
"""The tools a PreToolUse hook asks about: they wait for the user whatever the permission rules say."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def agent_id_for(payload: HookPayload, given: str | None = None) -> str:
    """One agent per Claude Code session, so agent-scoped remembered decisions apply again."""
    if given:
        return given
    for unique in (payload.session_id, payload.tool_use_id):
        if unique and (slug := _UNSAFE.sub("-", unique)[:80]):
            return f"claude-code-{slug}"
    return "claude-code"


def key_for(payload: HookPayload, found: str | None) -> str | None:
    """The tool call's key: its tool_use_id, or the one ``found`` in the transcript; None (unkeyed) without.

    Never a digest of the call's content: identical calls would share it, and one answer would
    approve every one of them while it is kept.
    """
    for call_id in (payload.tool_use_id, found):
        if call_id and (slug := _UNSAFE.sub("-", call_id)[:120]):
            return f"tool-{slug}"
    return None


def hook_output(event: str, verdict: Verdict) -> dict[str, Any]:
    """The JSON Claude Code reads from the hook's stdout for ``event``."""
    if event == PRE_TOOL_USE:
        specific: dict[str, Any] = {
            "hookEventName": PRE_TOOL_USE,
            "permissionDecision": verdict.behavior,
            "permissionDecisionReason": verdict.reason,
        }
        if verdict.behavior == "allow" and verdict.updated_input is not None:
            specific["updatedInput"] = verdict.updated_input
        return {"hookSpecificOutput": specific}
    if verdict.behavior == "ask":  # no decision: Claude Code shows its own dialog
        return {"systemMessage": f"{verdict.reason}; Claude Code asks here instead"}
    decision: dict[str, Any] = {"behavior": verdict.behavior}
    if verdict.behavior == "deny":
        decision["message"] = verdict.reason
        if verdict.interrupt:
            decision["interrupt"] = True
    if verdict.behavior == "allow" and verdict.updated_input is not None:
        decision["updatedInput"] = verdict.updated_input
    if verdict.behavior == "allow" and verdict.updated_permissions:
        decision["updatedPermissions"] = verdict.updated_permissions
    return {"hookSpecificOutput": {"hookEventName": PERMISSION_REQUEST, "decision": decision}}


class _Local:
    """The local user's side of the race: why the team's question was withdrawn for them, if it was."""

    def __init__(self, transcript: Transcript | None, grace: float | None) -> None:
        self.transcript = transcript
        self.grace = grace
        self.decided = False
        """Claude Code's dialog (or the user interrupting) decided the call first"""
        self.handed_back = False
        """the grace passed without a team answer: Claude Code's dialog asks instead"""

    async def watch(self, abort: asyncio.Event) -> None:
        if self.transcript is None and self.grace is None:
            return
        waits = []
        if self.transcript is not None:
            waits.append(asyncio.ensure_future(self.transcript.decided()))
        if self.grace is not None:
            waits.append(asyncio.ensure_future(asyncio.sleep(self.grace)))
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if self.transcript is not None and waits[0] in done:
            self.decided = True
        else:
            self.handed_back = True
        abort.set()


async def _ask(
    settings: Settings, asking: Asking, agent_id: str, timeout: float, local: _Local, key: str | None
) -> AskUserQuestionAnswer:
    abort = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # Claude Code gives up on us: withdraw the question
        loop.add_signal_handler(sig, abort.set)
    watching = asyncio.ensure_future(local.watch(abort))
    try:
        if settings.gateway_url:
            return await _ask_gateway(settings, asking, abort, timeout, key)
        async with settings.broker() as broker, broker.agent(agent_id) as agent:
            # What the card shows cut is kept whole before anyone can see the card.
            await asyncio.gather(*(agent.attach(text) for text in asking.attachments))
            # Keyed (a call with an id): a hook killed without a word (SIGKILL) leaves its question pending
            # for as long as it would have waited, and a newer hook of the same session taking the agent id
            # over only marks it "asker away": the process still waiting gets its answer.
            return await agent.ask(
                asking.request,
                abort=abort,
                timeout=timeout,
                key=key,
                detach_grace=timeout if key is not None else None,
                remember=asking.remember,
                coalesce=asking.coalesce,
            )
    except* UserQuestionError as group:
        raise group.exceptions[0] from None
    except* (OSError, RedisError) as group:
        raise UserQuestionError(f"Redis is unavailable: {group.exceptions[0]}", BROKER_UNAVAILABLE) from None
    finally:
        watching.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _ask_gateway(
    settings: Settings, asking: Asking, abort: asyncio.Event, timeout: float, key: str | None
) -> AskUserQuestionAnswer:
    """The same ask through ``qbroker gateway``: no Redis credentials here, and the token names the agent."""
    from workers.asking.gateway.client import GatewayClient

    async with GatewayClient(settings.gateway_url, settings.gateway_token) as gateway:
        return await gateway.ask(
            asking.request,
            abort=abort,
            timeout=timeout,
            key=key,
            attachments=asking.attachments,
            detach_grace=timeout if key is not None else None,
            remember=asking.remember,
            coalesce=asking.coalesce,
        )


_HEADLESS_ENTRYPOINTS: Final = "sdk"
"""``CLAUDE_CODE_ENTRYPOINT`` starts so in sessions that cannot show a dialog (``sdk-cli``: claude -p; ``sdk-py``,
``sdk-ts``: the Agent SDK); ``cli`` is the interactive terminal"""
_STILL_NOBODY: Final = frozenset({NO_PROVIDER, BROKER_UNAVAILABLE})
"""what ``--headless wait`` asks again after: nobody could take the question yet"""


def is_headless(session: str, environ: Mapping[str, str]) -> bool:
    """Whether Claude Code can show no dialog of its own: ``--session``, else what Claude Code's environment says."""
    if session != "auto":
        return session == "headless"
    return environ.get("CLAUDE_CODE_ENTRYPOINT", "").startswith(_HEADLESS_ENTRYPOINTS)


def _say(message: str) -> None:
    print(f"qbroker claude-hook: {message}", file=sys.stderr, flush=True)


async def hook(args: argparse.Namespace) -> int:
    settings: Settings = args.settings
    raw = sys.stdin.buffer.read()
    try:
        payload = msgspec.json.decode(raw, type=HookPayload)
    except msgspec.DecodeError as error:
        _say(f"not a Claude Code hook payload ({error}); passes through")
        return 0
    event = payload.hook_event_name
    if event not in (PERMISSION_REQUEST, PRE_TOOL_USE) or not payload.tool_name:
        _say(
            f"{event or 'an event'!r} passes through: it asks on PermissionRequest, and PreToolUse of "
            + ", ".join(sorted(ASKED_BEFORE_USE))
        )
        return 0
    if event == PRE_TOOL_USE and payload.tool_name not in ASKED_BEFORE_USE:
        # PreToolUse fires before Claude Code applies the user's rules and mode: asking here would ask
        # about calls the user already allowed, and then Claude Code would prompt again.
        _say(f"PreToolUse of {payload.tool_name} passes through: hook PermissionRequest for it")
        return 0
    if not shows_whole(payload):
        # No face could show every byte Allow would let run: the team is not asked to approve it unseen.
        _say(f"the {payload.tool_name} input is too large to show whole: Claude Code asks locally")
        return _print(event, Verdict("ask", f"the {payload.tool_name} input is too large for question-broker to show"))
    asking = asking_for(payload, remember=bool(args.remember), destination=args.remember_in)
    if asking is None:
        _say(f"the {payload.tool_name} input is not the shape it expects: Claude Code asks locally")
        return _print(event, Verdict("ask", f"question-broker could not read the {payload.tool_name} input"))
    headless = is_headless(args.session, os.environ)
    transcript = Transcript.of(payload)
    # Headless, there is no dialog to hand the call back to: the team may answer until the timeout.
    local = _Local(transcript, None if headless else args.local_grace)
    key = key_for(payload, transcript.tool_use_id if transcript is not None else None)
    deadline = asyncio.get_running_loop().time() + args.timeout
    try:
        while True:
            try:
                left = deadline - asyncio.get_running_loop().time()
                answer = await _ask(settings, asking, agent_id_for(payload, args.agent), left, local, key)
                break
            except UserQuestionError as error:
                left = deadline - asyncio.get_running_loop().time()
                if not (headless and args.headless == "wait" and error.code in _STILL_NOBODY and left > 1):
                    raise
                _say(f"{error.code}: asking again (--headless wait; {left:.0f} s left)")
                await asyncio.sleep(min(2.0, left - 1))
    except UserQuestionError as error:
        if local.decided:  # Claude Code already applied the local decision: it reads nothing more from us
            _say("answered in Claude Code first: the team's question is withdrawn")
            return 0
        if local.handed_back:
            return _print(
                event,
                Verdict("ask", f"nobody on the team answered within {args.local_grace:g} s, so the local user decides"),
            )
        if error.code == ASK_CANCELLED:
            return _print(
                event, Verdict("deny", f"the user dismissed the question in question-broker: {error.message}")
            )
        _say(str(error))
        verdict = Verdict(args.on_unavailable, f"question-broker: {error.code}: {error.message}")
        return _print(event, verdict, headless=headless)
    return _print(event, asking.verdict(answer), headless=headless)


def _print(event: str, verdict: Verdict, *, headless: bool = False) -> int:
    if headless and verdict.behavior == "ask":
        # Claude Code denies an undecided call in a session that cannot prompt, telling the model nothing: deny
        # it here, with the reason as the message the model reads.
        verdict = Verdict("deny", f"{verdict.reason} (a headless Claude Code session: nobody can answer locally)")
    sys.stdout.write(json.dumps(hook_output(event, verdict), ensure_ascii=False) + "\n")
    sys.stdout.flush()
    return 0
