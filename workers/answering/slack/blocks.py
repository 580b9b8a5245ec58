"""A card as Slack Block Kit: what a person sees in the channel, and the modals it opens.

Everything an asker wrote is untrusted: it goes into ``mrkdwn`` with ``&``, ``<`` and ``>``
escaped, so a question cannot mention ``<!channel>``, a user or a disguised link; button and
option texts are ``plain_text``. Every interactive element carries the namespace and the
request id (``value`` / ``private_metadata``): a click reaching any server of the namespace
finds its card again, and nothing in Slack's state is trusted beyond naming what was clicked
(the answer is checked by the provider like one from the page).
"""

from __future__ import annotations

import json
from typing import Any

from broker import AskUserQuestionItem, PendingRequest
from workers.answering.web.render import plan_review

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
"""a plan longer than this (a section holds 3000) is cut in the card and posted whole in its thread"""
_LABEL = 75
"""Slack's limit for a button's or an option's plain text"""
_PRIORITY = {"urgent": ":rotating_light: urgent", "normal": "normal", "low": "low"}


def escape(text: str) -> str:
    """Asker text made inert in ``mrkdwn``: no mentions, no links, no ``<!here>``."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain(text: str, limit: int = _LABEL) -> dict[str, Any]:
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


def _question_text(item: AskUserQuestionItem) -> str:
    header = f"*{escape(item.header)}*\n" if item.header else ""
    text = header + escape(item.question)
    if item.detail:
        detail = escape(item.detail)
        if len(detail) > PLAN_INLINE:
            detail = detail[:PLAN_INLINE] + "…\n_(the whole text is in this message's thread)_"
        text += "\n" + detail
    return text[:3000]


def plan_chunks(pending: PendingRequest) -> list[str]:
    """The details too long for the card, whole, in pieces a thread reply can hold."""
    chunks: list[str] = []
    for item in pending.request.questions:
        detail = escape(item.detail or "")
        if len(detail) > PLAN_INLINE:
            chunks.extend(detail[i : i + 2900] for i in range(0, len(detail), 2900))
    return chunks


def card_blocks(pending: PendingRequest, view: dict[str, Any], namespace: str, web_url: str = "") -> list[Any]:
    """The card while it waits: questions, choices, Other, Dismiss; a plan's Approve / Decline."""
    questions = pending.request.questions
    ref = _ref(namespace, pending.request_id)
    blocks: list[Any] = [_context(view, namespace)]
    for index, item in enumerate(questions):
        blocks.append(
            {"type": "section", "block_id": f"qbx_{index}", "text": {"type": "mrkdwn", "text": _question_text(item)}}
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
    if review is not None:
        actions.append(_button(review["approve"], "qb_approve", ref, "primary"))
        actions.append(_button("Decline with a note…", "qb_decline", ref, "danger"))
    elif too_many:
        pass  # more choices than Slack shows: answered on the page (linked below)
    elif len(questions) == 1 and not questions[0].multi_select and questions[0].labels:
        for o, label in enumerate(questions[0].labels):
            actions.append(_button(label, f"qb_pick_{o}", _ref(namespace, pending.request_id, o=o)))
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
            actions.append(_button("Submit", "qb_submit", ref, "primary"))
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
