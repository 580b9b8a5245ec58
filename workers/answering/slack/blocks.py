"""A card as Slack Block Kit: what a person sees in the channel, and the modals it opens.

Everything an asker wrote is untrusted: it goes into ``mrkdwn`` with ``&``, ``<`` and ``>``
escaped, so a question cannot mention ``<!channel>``, a user or a disguised link; button and
option texts are ``plain_text``; and every text passes ``workers.inert`` (control characters and
bidi overrides shown as escapes). An approval's arguments are shown in the card; what the card
cannot hold (a long plan, long arguments) is posted whole in its thread, the card says how many
characters it does not show, and its approving buttons then ask for a confirmation.

Every interactive element carries the namespace and the request id (``value`` /
``private_metadata``): a click reaching any server of the namespace finds its card again, and
nothing in Slack's state is trusted beyond naming what was clicked (the answer is checked by the
provider like one from the page).
"""

from __future__ import annotations

import json
from typing import Any

from broker import AskUserQuestionItem, PendingRequest
from workers.answering.web.render import plan_review
from workers.inert import inert, inert_json

__all__ = [
    "MAX_CHOICES",
    "PLAN_INLINE",
    "card_blocks",
    "decline_modal",
    "escape",
    "other_modal",
    "plan_chunks",
    "settled_blocks",
]

MAX_CHOICES = 10
"""Slack's limit for checkboxes and radio buttons; a question with more is answered on the page"""
PLAN_INLINE = 2800
"""a plan (or an approval's arguments) longer than this (a section holds 3000) is cut in the card and posted
whole in its thread"""
_LABEL = 75
"""Slack's limit for a button's or an option's plain text"""
_PRIORITY = {"urgent": ":rotating_light: urgent", "normal": "normal", "low": "low"}


def escape(text: str) -> str:
    """Asker text made inert in ``mrkdwn``: no mentions, no links, no ``<!here>``, nothing that steers."""
    text = inert(text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain(text: str, limit: int = _LABEL) -> dict[str, Any]:
    text = inert(text)
    return {"type": "plain_text", "text": text if len(text) <= limit else text[: limit - 1] + "…", "emoji": False}


def _ref(namespace: str, request_id: str, **more: Any) -> str:
    return json.dumps({"n": namespace, "r": request_id, **more}, separators=(",", ":"))


def _button(text: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {"type": "button", "text": _plain(text), "action_id": action_id, "value": value}
    if style:
        button["style"] = style
    return button


def _context(view: dict[str, Any], namespace: str) -> dict[str, Any]:
    askers = [a.get("agent") or "an agent" for a in view.get("askers") or ()] or [view.get("agent") or "an agent"]
    parts = [
        "from *" + escape(", ".join(dict.fromkeys(askers))) + "*",
        _PRIORITY.get(view.get("priority") or "normal", escape(str(view.get("priority")))),
        "namespace `" + escape(namespace) + "`",
    ]
    deadline = view.get("deadlineMs")
    if deadline:
        at = int(deadline) // 1000
        parts.append(f"answer by <!date^{at}^{{date_short_pretty}} {{time}}|{at}>")
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(parts)}]}


def quorum_line(quorum: dict[str, Any]) -> str:
    """Where a covered card stands: what it needs, who approved, who may still."""
    groups = f" from {', '.join(quorum['groups'])}" if quorum.get("groups") else ""
    parts = [f"*Needs {quorum['needed']} approval{'s' if quorum['needed'] != 1 else ''}{groups}*"]
    if quorum.get("approvedBy"):
        parts.append("approved by " + ", ".join(quorum["approvedBy"]))
    if quorum.get("declinedBy"):
        parts.append("declined by " + ", ".join(quorum["declinedBy"]))
    if quorum.get("mayStill") is not None:
        parts.append("may still: " + (", ".join(quorum["mayStill"]) or "nobody"))
    if quorum.get("escalatesTo"):
        verb = "escalated to " if quorum.get("escalated") else "escalates to "
        parts.append(verb + quorum["escalatesTo"])
    return escape(" · ".join(parts))


def _question_text(item: AskUserQuestionItem) -> tuple[str, int]:
    """The question's section, and how many characters of it the card does not show."""
    header = f"*{escape(item.header)}*\n" if item.header else ""
    text = header + escape(item.question)
    unseen = 0
    if item.detail:
        detail = escape(item.detail)
        if len(detail) > PLAN_INLINE:
            unseen = len(detail) - PLAN_INLINE
            detail = (
                detail[:PLAN_INLINE] + f"…\n_({unseen} more characters: the whole text is in this message's thread)_"
            )
        text += "\n" + detail
    return text[:3000], unseen + max(0, len(text) - 3000)


def _arguments(item: AskUserQuestionItem) -> str:
    """The arguments an approval runs with, as the card and its thread show them."""
    return "" if item.editable is None else escape(inert_json(item.editable.arguments))


def _arguments_block(item: AskUserQuestionItem, index: int) -> tuple[dict[str, Any], int]:
    arguments = _arguments(item)
    shown, unseen = arguments[:PLAN_INLINE], max(0, len(arguments) - PLAN_INLINE)
    more = f"\n_({unseen} more characters: the whole arguments are in this message's thread)_" if unseen else ""
    text = f"*Arguments it runs with:*\n```{shown}```{more}"
    return {"type": "section", "block_id": f"qba_{index}", "text": {"type": "mrkdwn", "text": text}}, unseen


def plan_chunks(pending: PendingRequest) -> list[str]:
    """The details and arguments too long for the card, whole, in pieces a thread reply can hold."""
    chunks: list[str] = []
    for item in pending.request.questions:
        for text, fence in ((escape(item.detail or ""), ""), (_arguments(item), "```")):
            if len(text) > PLAN_INLINE:
                chunks.extend(f"{fence}{text[i : i + 2900]}{fence}" for i in range(0, len(text), 2900))
    return chunks


def _confirm(unseen: int, approve: str, attached: int = 0) -> dict[str, Any]:
    """The second step approving what the card does not show takes (Slack's confirmation dialog)."""
    where = "on the web page" if attached else "in its thread and on the web page"
    return {
        "title": _plain("Approve what is not shown?", 100),
        "text": _plain(
            f"{unseen + attached} characters of what this approves are not shown in the card (they are {where})."
            " Approve without reading them?",
            300,
        ),
        "confirm": _plain(approve, 30),
        "deny": _plain("Back", 30),
    }


def _approving(item: AskUserQuestionItem, review: dict[str, Any] | None) -> str | None:
    """The label that approves; None: any pick may (a plain question does not say which)."""
    if review is not None:
        return str(review["approve"])
    return item.editable.approve if item.editable is not None else None


def card_blocks(pending: PendingRequest, view: dict[str, Any], namespace: str, web_url: str = "") -> list[Any]:
    """The card while it waits: questions, choices, Other, Dismiss; a plan's Approve / Decline."""
    questions = pending.request.questions
    ref = _ref(namespace, pending.request_id)
    blocks: list[Any] = [_context(view, namespace)]
    unseen = 0
    for index, item in enumerate(questions):
        text, cut = _question_text(item)
        unseen += cut
        blocks.append({"type": "section", "block_id": f"qbx_{index}", "text": {"type": "mrkdwn", "text": text}})
        if item.editable is not None:
            block, cut = _arguments_block(item, index)
            unseen += cut
            blocks.append(block)
    # A text attached whole (the Claude Code hook's long tool input) is too large for Slack: the page shows it.
    attached = sum(item.attachment.size for item in questions if item.attachment is not None)
    notes = []
    if unseen:
        where = "in this message's thread" + (" and on the web page" if web_url else "")
        notes.append(f"*{unseen} characters of what this approves are not shown here*: they are whole {where}.")
    if attached:
        notes.append(
            f"*The whole of it ({attached:,} bytes) is attached*: read it on the web page"
            + (" (Open on the web)" if web_url else " (this server has no --public-url to link it)")
            + " before approving."
        )
    if notes:
        blocks.append(
            {"type": "context", "block_id": "qb_unseen", "elements": [{"type": "mrkdwn", "text": " ".join(notes)}]}
        )
    if view.get("quorum"):
        blocks.append(
            {
                "type": "context",
                "block_id": "qb_quorum",
                "elements": [{"type": "mrkdwn", "text": quorum_line(view["quorum"])}],
            }
        )
    too_many = any(len(item.labels) > MAX_CHOICES for item in questions)
    review = plan_review(questions[0], len(questions))
    actions: list[Any] = []
    approve = _approving(questions[0], review) if len(questions) == 1 else None

    def confirmed(button: dict[str, Any], label: str | None) -> dict[str, Any]:
        if (unseen or attached) and (approve is None or label == approve):
            button["confirm"] = _confirm(unseen, label or "Submit", attached)
        return button

    if review is not None:
        actions.append(confirmed(_button(review["approve"], "qb_approve", ref, "primary"), review["approve"]))
        actions.append(_button("Decline with a note…", "qb_decline", ref, "danger"))
    elif too_many:
        pass  # more choices than Slack shows: answered on the page (linked below)
    elif len(questions) == 1 and not questions[0].multi_select and questions[0].labels:
        for o, label in enumerate(questions[0].labels):
            actions.append(confirmed(_button(label, f"qb_pick_{o}", _ref(namespace, pending.request_id, o=o)), label))
    else:
        for index, item in enumerate(questions):
            if not item.labels:
                continue
            options = [{"text": _plain(label), "value": str(o)} for o, label in enumerate(item.labels)]
            element = {
                "type": "checkboxes" if item.multi_select else "radio_buttons",
                "action_id": "qb_sel",
                "options": options,
            }
            blocks.append({"type": "actions", "block_id": f"qbq_{index}", "elements": [element]})
        if any(item.labels for item in questions):
            actions.append(confirmed(_button("Submit", "qb_submit", ref, "primary"), None))
    if review is None and not too_many:
        actions.append(_button("Other…", "qb_other", ref))
        actions.append(_button("Dismiss", "qb_dismiss", ref))
    if web_url:
        actions.append({"type": "button", "text": _plain("Open on the web"), "action_id": "qb_web", "url": web_url})
    if actions:
        blocks.append({"type": "actions", "block_id": "qb_actions", "elements": actions})
    return blocks


def settled_blocks(pending_blocks: list[Any], outcome: str) -> list[Any]:
    """The card once it is gone: its questions kept, the buttons replaced by what happened."""
    kept = [
        block for block in pending_blocks if block.get("type") != "actions" and block.get("block_id") != "qb_quorum"
    ]
    return [*kept, {"type": "context", "block_id": "qb_outcome", "elements": [{"type": "mrkdwn", "text": outcome}]}]


def _modal(callback_id: str, title: str, metadata: str, blocks: list[Any], submit: str) -> dict[str, Any]:
    return {
        "type": "modal",
        "callback_id": callback_id,
        "private_metadata": metadata,
        "title": _plain(title, 24),
        "submit": _plain(submit, 24),
        "close": _plain("Cancel", 24),
        "blocks": blocks,
    }


def other_modal(pending: PendingRequest, metadata: str) -> dict[str, Any]:
    """Free text for each question (a batch: only those typed in replace the picks on the card)."""
    questions = pending.request.questions
    blocks = [
        {
            "type": "input",
            "block_id": f"qbt_{index}",
            "optional": len(questions) > 1,
            "label": _plain(item.question, 2000),
            "element": {"type": "plain_text_input", "action_id": "text", "multiline": True, "max_length": 2000},
        }
        for index, item in enumerate(questions)
    ]
    return _modal("qb_other", "Your own answer", metadata, blocks, "Send")


def decline_modal(pending: PendingRequest, metadata: str, refuse: str | None) -> dict[str, Any]:
    """Decline a plan, with a note the agent reads as the answer (optional when there is a refuse label)."""
    element = {"type": "plain_text_input", "action_id": "text", "multiline": True, "max_length": 2000}
    note = {
        "type": "input",
        "block_id": "qbt_0",
        "optional": refuse is not None,
        "label": _plain("What should change? The agent reads this as your answer.", 2000),
        "element": element,
    }
    return _modal("qb_decline", "Decline the plan", metadata, [note], "Decline")
