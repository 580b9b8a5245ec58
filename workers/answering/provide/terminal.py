"""The terminal provider's presentation: one request at a time, one question at a time.

``Terminal`` renders with rich (markdown for ``detail`` and plans) and reads with
prompt_toolkit, whose prompt can be cancelled when the asker withdraws or the lease is
lost. ``present()`` returns what the human decided; the caller settles it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prompt_toolkit import PromptSession
from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape
from rich.rule import Rule

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionRequest,
    PendingRequest,
    PlanReviewIntent,
    Policies,
    Remember,
    UserQuestionError,
    check_answer,
)
from workers.inert import inert, inert_json

__all__ = ["Decision", "Quit", "Terminal", "is_plan_review"]

Prompt = Callable[[str], Awaitable[str]]

_SKIP = ("s", "/skip")
_CANCEL = ("c", "/cancel")
_OTHER = ("o", "/other")
_EDIT = ("e", "/edit")
_VIEW = ("v", "/view")
_HAND_ON = ("h", "/handover")

SHOWN = 2000
"""characters of a detail (or of an approval's arguments) shown with the question; v shows the rest"""


@dataclass(frozen=True)
class Decision:
    """The human's verdict on a whole request: an answer, or a cancel."""

    answer: AskUserQuestionAnswer | None = None
    cancelled: bool = False
    remember: Remember | None = None
    """also remember the answer (for this agent or the namespace), atomically with sending it"""
    handed_on: bool = False
    """neither: the human handed the request on unanswered (to the provider that asked for the lease)"""


class _Cancel(Exception):
    """The human cancelled the whole request."""


class _HandOn(Exception):
    """The human handed the request on, unanswered."""


class Quit(Exception):
    """The human pressed Ctrl-C or Ctrl-D at a prompt: stop providing."""


def is_plan_review(pending: PendingRequest) -> bool:
    """One question with a plan-review intent and a plan in ``detail``: shown as a card."""
    questions = pending.request.questions
    if len(questions) != 1:
        return False
    item = questions[0]
    return isinstance(item.intent, PlanReviewIntent) and item.detail is not None and item.intent.approve in item.labels


class Terminal:
    def __init__(
        self, console: Console | None = None, prompt: Prompt | None = None, *, remember_ttl: float = 3600.0
    ) -> None:
        self.console = console or Console(highlight=False)
        self.policies = Policies()
        """quorum policies (``--policy-file``): a covered card takes this person's one vote"""
        self.person = ""
        """who answers at this terminal (``--as``), named in votes"""
        self.remember_ttl = remember_ttl
        """how long an answer the human says to remember lives; 0: the offer is not made"""
        if prompt is None:
            session: PromptSession[str] = PromptSession()
            prompt = session.prompt_async
        self._prompt = prompt
        self.handing_to: str | None = None
        """the provider that asked for the lease: while set, h hands the shown request to it unanswered"""
        self._unseen = 0
        """characters of the shown question's detail and arguments not shown yet (v shows them)"""
        self.fetch_attachment: Callable[[str], Awaitable[str | None]] | None = None
        """reads a question's attachment (``Broker.attachment``): what ``v`` shows of a text the card shows cut"""

    def say(self, message: str, style: str = "bold yellow") -> None:
        # inert: a refusal's message may quote what an asker wrote (a label, an id)
        self.console.print(inert(message), style=style, markup=False)

    async def ask(self, message: str, *, free: bool = False) -> str:
        """A line typed at the prompt; ``free``: free text, where only ``/handover`` hands the request on."""
        try:
            text = (await self._prompt(message)).strip()
        except (EOFError, KeyboardInterrupt):
            raise Quit from None
        if self.handing_to is not None and (text == _HAND_ON[1] or (not free and text.lower() == _HAND_ON[0])):
            raise _HandOn
        return text

    async def present(self, pending: PendingRequest, queued: int) -> Decision:
        """Show the request and collect the answer (or a cancel)."""
        self._banner(pending, queued)
        try:
            if is_plan_review(pending):
                return await self._plan_review(pending.request.questions[0])
            items = []
            total = len(pending.request.questions)
            for index, item in enumerate(pending.request.questions, start=1):
                items.append(await self._question(item, index, total))
            answer = AskUserQuestionAnswer(answers=tuple(items))
            return Decision(answer=answer, remember=await self._remember(pending, answer))
        except _Cancel:
            return Decision(cancelled=True)
        except _HandOn:  # never an answer: the request stays pending for the next provider
            return Decision(handed_on=True)

    async def _remember(self, pending: PendingRequest, answer: AskUserQuestionAnswer) -> Remember | None:
        """Offer "and don't ask again": for the asking agent, or for the whole namespace."""
        if self.remember_ttl <= 0 or not pending.can_remember(answer) or self.policies.for_card(pending) is not None:
            return None
        ttl = Remember(ttl=self.remember_ttl).ttl
        span = f"{ttl / 3600:g}h" if ttl >= 3600 else f"{ttl / 60:g}m" if ttl >= 60 else f"{ttl:g}s"
        agent = pending.agent_id if pending.can_remember(answer, "agent") else None
        agents = [asker.agent_id for asker in pending.askers if asker.agent_id]
        whom = f"each asking agent ({', '.join(agents)})" if len(agents) > 1 else f"agent {agent}"
        offers = [f"a: remember it for {whom}"] if agent else []
        offers.append("n: remember it for the whole namespace")
        self.say(f"Enter sends it; {'; '.join(offers)} (for {span}; later identical questions are answered at once).",
                 "dim")  # fmt: skip
        while True:
            text = (await self.ask("Send: ")).lower()
            if not text:
                return None
            if text == "a" and agent:
                return Remember(scope="agent", ttl=ttl)
            if text == "n":
                return Remember(scope="namespace", ttl=ttl)
            if text in _CANCEL:
                raise _Cancel
            self.say(f"Press Enter to send{', a' if agent else ''} or n to send and remember, c to cancel instead.")

    def _banner(self, pending: PendingRequest, queued: int) -> None:
        waited = max(0.0, time.time() - pending.created_ms / 1000)
        # verified: a gateway this terminal pins vouched for the id; claimed: the asker names itself
        who = (
            f"agent {inert(pending.agent_id)} ({_identity(pending.verified)})"
            if pending.agent_id
            else "an agentless asker"
        )
        askers = pending.askers
        if len(askers) > 1:
            named = (f"{inert(a.agent_id)} ({_identity(a.verified)})" if a.agent_id else "agentless" for a in askers)
            who = f"{len(askers)} agents ({', '.join(named)})"
        more = f" · {queued} more waiting" if queued else ""
        away = " · asker away" if pending.asker_away else ""
        priority = f"{pending.priority.upper()} · " if pending.priority != "normal" else ""
        self.console.print()
        rule = f"{priority}Request from {who} · waiting {waited:.0f}s{more}{away}"
        self.console.print(Rule(escape(rule), style="bold red" if pending.priority == "urgent" else "cyan"))
        if len(askers) > 1:
            self.console.print("One answer goes to each of them.", style="dim")
        if pending.asker_away:
            self.console.print("The asking process stopped; your answer is kept until it comes back.", style="yellow")

    def _heading(self, item: AskUserQuestionItem, index: int, total: int) -> None:
        counter = f"[{index}/{total}] " if total > 1 else ""
        header = f"{inert(item.header)} · " if item.header else ""
        self.console.print(f"{counter}{header}", style="bold cyan", markup=False, end="")
        self.console.print(inert(item.question), style="bold", markup=False)
        self._unseen = 0
        if item.detail:
            self._detail(item.detail, "the text", style="dim")
        if item.editable is not None:
            self.console.print("Arguments it runs with:", style="bold", markup=False)
            self._long(inert_json(item.editable.arguments), "the arguments")
        if item.attachment is not None:  # the whole of what the card shows cut: one key away, as on the page
            self._unseen += item.attachment.size
            self.say(
                f"The whole of it ({item.attachment.size:,} bytes, SHA-256 {item.attachment.sha256[:16]}…) is "
                "attached: v shows it here, as does the web page."
            )

    def _detail(self, detail: str, what: str, style: str = "") -> None:
        shown = inert(detail)
        self.console.print(Markdown(shown[:SHOWN]), style=style)
        self._cut(len(shown), what)

    def _long(self, text: str, what: str) -> None:
        self.console.print(text[:SHOWN], markup=False, soft_wrap=True)
        self._cut(len(text), what)

    def _cut(self, length: int, what: str) -> None:
        if length > SHOWN:
            more = length - SHOWN
            self._unseen += more
            self.say(f"… {more} more characters of {what} are not shown (v shows them whole, as does the web page).")

    async def _view_all(self, item: AskUserQuestionItem) -> None:
        """Everything the question carries, whole: its detail, the arguments an approval runs with, its attachment."""
        if item.detail:
            self.console.print(Markdown(inert(item.detail)))
        if item.editable is not None:
            self.console.print(inert_json(item.editable.arguments), markup=False, soft_wrap=True)
        if item.attachment is not None:
            whole = await self.fetch_attachment(item.attachment.sha256) if self.fetch_attachment else None
            if whole is None:  # gone, or not the bytes the question named: still unseen, so still confirmed
                self.say("The attachment is gone or is not the text the question named: nobody can see it whole.")
                self._unseen = item.attachment.size
                return
            self.console.print(inert(whole), markup=False, soft_wrap=True)
        self._unseen = 0

    async def _seen(self, item: AskUserQuestionItem, labels: tuple[str, ...], approve: str | None) -> bool:
        """Whether picking ``labels`` may go: approving what was not shown takes a typed yes."""
        if not self._unseen or (approve is not None and approve not in labels):
            return True
        self.say(
            f"Approve without seeing {self._unseen} characters of what it approves? Type yes (v shows them first)."
        )
        text = (await self.ask("Approve unseen: ")).lower()
        if text in _VIEW:
            await self._view_all(item)
            return False
        return text == "yes"

    def _options(self, item: AskUserQuestionItem, chosen: set[str] | None = None) -> None:
        for number, option in enumerate(item.options or (), start=1):
            mark = "" if chosen is None else ("[x] " if option.label in chosen else "[ ] ")
            line = f"  {mark}{number}. {inert(option.label)}"
            if option.description:
                line += f" — {inert(option.description)}"
            self.console.print(line, markup=False)

    async def _question(self, item: AskUserQuestionItem, index: int, total: int) -> AskUserQuestionAnswerItem:
        # A skip is an answer ("skipped while the rest of the batch was answered"): offered only in a batch.
        self._heading(item, index, total)
        if not item.options:
            return await self._free_text(item, total > 1)
        if item.multi_select:
            return await self._multi(item, total > 1)
        return await self._single(item, total > 1)

    def _hand_on_hint(self) -> str:
        return f"; h: hand it to {inert(self.handing_to)} unanswered" if self.handing_to is not None else ""

    async def _free_text(self, item: AskUserQuestionItem, optional: bool) -> AskUserQuestionAnswerItem:
        skip = "/skip skips this question, " if optional else ""
        self.say(f"Type your answer; {skip}/cancel cancels the request.", "dim")
        while True:
            text = await self.ask("Answer: ", free=True)
            if text == "/skip" and optional:
                return AskUserQuestionAnswerItem(id=item.id, selected=())
            if text == "/cancel":
                raise _Cancel
            if text == "/view":
                await self._view_all(item)
            elif text == "/skip":
                self.say("This question is the whole request: answer it, or /cancel.")
            elif text:
                return AskUserQuestionAnswerItem(id=item.id, selected=(), custom=text)

    def _pick(self, item: AskUserQuestionItem, text: str) -> str | None:
        if text.isdigit() and 1 <= int(text) <= len(item.labels):
            return item.labels[int(text) - 1]
        return None

    async def _other(self) -> str | None:
        text = await self.ask("Other (empty to go back): ", free=True)
        return text or None

    async def _single(self, item: AskUserQuestionItem, optional: bool) -> AskUserQuestionAnswerItem:
        self._options(item)
        edit = f"e: edit the arguments and {inert(item.editable.approve)}, " if item.editable else ""
        skip = "s: skip this question, " if optional else ""
        view = "v: view it whole, " if self._unseen else ""
        self.say(f"Pick a number; {edit}{view}o: Other (free text), {skip}c: cancel the request.", "dim")
        while True:
            text = (await self.ask("Choice: ")).lower()
            if text in _EDIT and item.editable is not None:
                if (edited := await self._edit(item)) is not None:
                    return edited
                continue
            if (label := self._pick(item, text)) is not None:
                if await self._seen(item, (label,), _approving(item)):
                    return AskUserQuestionAnswerItem(id=item.id, selected=(label,))
                continue
            if text in _VIEW:
                await self._view_all(item)
                continue
            if text in _OTHER and (custom := await self._other()) is not None:
                return AskUserQuestionAnswerItem(id=item.id, selected=(), custom=custom)  # replaces the choice
            if text in _SKIP and optional:
                return AskUserQuestionAnswerItem(id=item.id, selected=())
            if text in _CANCEL:
                raise _Cancel
            if text in _SKIP:
                self.say(
                    f"This question is the whole request: pick an answer, or c to cancel it{self._hand_on_hint()}."
                )
            elif text not in _OTHER:
                self.say(f"Type a number from 1 to {len(item.labels)}, or o, {'s, ' if optional else ''}c.")

    async def _edit(self, item: AskUserQuestionItem) -> AskUserQuestionAnswerItem | None:
        """The arguments edited as one line of JSON, checked as the provider will; None: back to the choice."""
        assert item.editable is not None
        approve = item.editable.approve
        self.console.print(inert_json(item.editable.arguments, indent=None), markup=False, soft_wrap=True)
        self._unseen = 0  # shown whole: what an edit approves is what the human typed
        self.say(f"Type the arguments as one line of JSON ({inert(approve)} goes with them); empty goes back.", "dim")
        while True:
            text = await self.ask("Arguments: ", free=True)
            if not text:
                return None
            try:
                edited: Any = json.loads(text)
            except ValueError as error:
                self.say(f"Not JSON: {error}")
                continue
            if not isinstance(edited, dict):
                self.say("The arguments must be a JSON object ({...}).")
                continue
            picked = AskUserQuestionAnswerItem(
                id=item.id, selected=(approve,), edited=None if edited == item.editable.arguments else edited
            )
            try:  # the provider checks it again on sending; checked here, a mistake is fixed in place
                check_answer(AskUserQuestionRequest(questions=(item,)), AskUserQuestionAnswer(answers=(picked,)))
            except UserQuestionError as error:
                self.say(error.message)
                continue
            return picked

    async def _multi(self, item: AskUserQuestionItem, optional: bool) -> AskUserQuestionAnswerItem:
        chosen: set[str] = set()
        custom: str | None = None
        self._options(item, chosen)
        skip = " s: skip;" if optional else ""
        self.say(f"Toggle with numbers (e.g. 1 3); o: add Other text; Enter: confirm;{skip} c: cancel.", "dim")
        while True:
            text = (await self.ask("Toggle: ")).lower()
            if not text:
                selected = tuple(label for label in item.labels if label in chosen)
                if not selected and custom is None:  # nothing picked is a skip, which only s says
                    self.say(f"Nothing is picked: toggle a number, o for Other{', s to skip' if optional else ''}"
                             f", or c to cancel{self._hand_on_hint()}.")  # fmt: skip
                    continue
                if await self._seen(item, selected, _approving(item)):
                    return AskUserQuestionAnswerItem(id=item.id, selected=selected, custom=custom)
                continue
            if text in _SKIP and optional:
                return AskUserQuestionAnswerItem(id=item.id, selected=())
            if text in _CANCEL:
                raise _Cancel
            if text in _VIEW:
                await self._view_all(item)
                continue
            if text in _OTHER:
                custom = await self._other()
            else:
                picks = [self._pick(item, word) for word in text.replace(",", " ").split()]
                if None in picks:
                    self.say(f"Type numbers from 1 to {len(item.labels)}, or o, s, c, or Enter to confirm.")
                    continue
                chosen.symmetric_difference_update(label for label in picks if label is not None)
            self._options(item, chosen)
            if custom is not None:
                self.console.print(f"  Other: {inert(custom)}", markup=False)

    async def _plan_review(self, item: AskUserQuestionItem) -> Decision:
        assert isinstance(item.intent, PlanReviewIntent) and item.detail is not None
        approve = item.intent.approve
        header = inert(item.header or "")
        self.console.print(f"Plan review · {header}".rstrip(" ·"), style="bold magenta", markup=False)
        self.console.print(inert(item.question), style="bold", markup=False)
        self._unseen = 0
        self._detail(item.detail, "the plan")
        choices = [approve, *(label for label in item.labels if label != approve)]
        for number, label in enumerate(choices, start=1):
            verdict = "approve" if label == approve else "decline"
            self.console.print(f"  {number}. {inert(label)} ({verdict})", markup=False)
        chat = len(choices) + 1
        self.console.print(f"  {chat}. Chat about it (cancel: the agent asks again after talking)", markup=False)
        while True:
            text = await self.ask("Verdict: ")
            if text.isdigit() and 1 <= int(text) <= len(choices):
                label = choices[int(text) - 1]
                if await self._seen(item, (label,), approve):
                    picked = AskUserQuestionAnswerItem(id=item.id, selected=(label,))
                    return Decision(answer=AskUserQuestionAnswer(answers=(picked,)))
                continue
            if text.lower() in _VIEW:
                await self._view_all(item)
                continue
            if text == str(chat) or text.lower() in _CANCEL:
                return Decision(cancelled=True)
            self.say(f"Type a number from 1 to {chat}{', or v to view the plan whole' if self._unseen else ''}.")


def _approving(item: AskUserQuestionItem) -> str | None:
    """The label that approves what the question carries; None: any pick may (a plain question says not which)."""
    if item.editable is not None:
        return item.editable.approve
    if isinstance(item.intent, PlanReviewIntent):
        return item.intent.approve
    return None


def _identity(verified: bool) -> str:
    return "verified" if verified else "claimed"
