"""What a page is sent about a request: asker text as data, markdown as sanitised HTML.

Everything an asker wrote is untrusted. Plain fields (question, header, labels,
descriptions, agent) go out as JSON strings that the page puts in with ``textContent``;
``detail`` is markdown, rendered here with raw HTML disabled and then sanitised, links
limited to safe schemes. Every text a page shows passes ``workers.inert`` first (control
characters and bidi overrides shown as escapes); a label keeps its own bytes as the value an
answer sends (``label``) beside what is shown (``text``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import msgspec
import nh3
from markdown_it import MarkdownIt

from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest, PendingRequest, PlanReviewIntent
from workers.inert import inert, inert_json

__all__ = ["plan_review", "readonly_view", "render_markdown", "request_view", "safe_url", "shown_agent"]

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
_TAGS = {
    "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li", "ol",
    "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
}  # fmt: skip
_ATTRIBUTES = {"a": {"href", "title"}, "td": {"align"}, "th": {"align"}, "ol": {"start"}}
_URL_SCHEMES = {"http", "https", "mailto"}


def safe_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL (fit for a link), else ``""``."""
    parts = urlsplit(url.strip())
    return url.strip() if parts.scheme in ("http", "https") and parts.netloc and len(url) <= 2000 else ""


def render_markdown(text: str) -> str:
    """Markdown to HTML that is safe to insert into the page (no images: they would fetch)."""
    html = _markdown.render(text)
    return nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes=_URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


def plan_review(item: AskUserQuestionItem, count: int) -> dict[str, Any] | None:
    """The plan-review card's buttons when the seeds' conditions hold, else ``None``.

    One question, a plan-review intent, a ``detail``, the approve label among at most two
    options, single-select. Any other shape gets the generic form, so no answer the
    request allows becomes unreachable.
    """
    intent = item.intent
    if intent is None or count != 1 or not isinstance(intent, PlanReviewIntent):  # the usual card: nothing to read
        return None
    labels = item.labels
    if item.detail is None or item.multi_select or len(labels) > 2 or intent.approve not in labels:
        return None
    refuse = next((label for label in labels if label != intent.approve), None)
    return {
        "approve": intent.approve,
        "refuse": refuse,
        "approveText": inert(intent.approve),
        "refuseText": None if refuse is None else inert(refuse),
    }


def _intent_kind(item: AskUserQuestionItem) -> str | None:
    intent = item.intent
    if intent is None:
        return None
    if isinstance(intent, PlanReviewIntent):  # a msgspec tag, not an attribute
        return "plan-review"
    return str(getattr(intent, "kind", "unknown"))


def _item_view(item: AskUserQuestionItem, count: int) -> dict[str, Any]:
    return {
        "id": item.id,
        "question": inert(item.question),
        "header": None if item.header is None else inert(item.header),
        "detailHtml": None if item.detail is None else render_markdown(inert(item.detail)),
        "options": _options_view(item.options or ()),
        "multiSelect": item.multi_select,
        "intent": _intent_kind(item),
        "planReview": plan_review(item, count),
        "editable": None if item.editable is None else _editable_view(item),
        "attachment": None if item.attachment is None else msgspec.to_builtins(item.attachment),
    }


@lru_cache(maxsize=4096)
def _options_view(options: tuple[AskUserQuestionOption, ...]) -> list[dict[str, Any]]:
    """One list for every card offering the same options (yes / no, approve / reject): a server showing 100 000
    cards holds it once. Shared, so never changed in place: a view that needs other options gets a new list."""
    return [
        {
            "label": option.label,
            "text": inert(option.label),
            "description": None if option.description is None else inert(option.description),
        }
        for option in options
    ]


def _editable_view(item: AskUserQuestionItem) -> dict[str, Any]:
    """The arguments an approval runs with, and ``argumentsText``: them as JSON a page shows and edits (parsing
    back to the same arguments)."""
    assert item.editable is not None
    view: dict[str, Any] = msgspec.to_builtins(item.editable)
    view["argumentsText"] = inert_json(item.editable.arguments)
    view["approveText"] = inert(item.editable.approve)
    return view


_REMEMBER_SCOPES: tuple[list[str], list[str], list[str]] = (["agent", "namespace"], ["namespace"], [])
"""the views' ``remember`` lists, shared by every card (never changed in place)"""


def request_view(pending: PendingRequest) -> dict[str, Any]:
    questions = pending.request.questions
    return {
        "id": pending.request_id,
        "agent": shown_agent(pending.agent_id),
        "createdMs": pending.created_ms,
        "askerAway": pending.asker_away,
        **asking_view(pending),
        "questions": [_item_view(item, len(questions)) for item in questions],
        "remember": _remember_scopes(pending),
    }


def asking_view(pending: PendingRequest) -> dict[str, Any]:
    """Who asks (several askers when identical requests were coalesced), whether a gateway vouched for it, how urgently.

    ``verified``: a pinned gateway attested every asker's agent id for this request; else the ids are only claimed.
    """
    askers = pending.askers  # built once: every card's view reads it, 100 000 of them in a failover
    return {
        "priority": pending.priority,
        "verified": all(asker.verified for asker in askers),
        "askers": [
            {"agent": shown_agent(asker.agent_id), "requestId": asker.request_id, "verified": asker.verified}
            for asker in askers
        ],
    }


@lru_cache(maxsize=4096)
def shown_agent(agent_id: str | None) -> str | None:
    """An agent id as shown: an asker names itself, so its id is asker text too (an agent's many cards: one
    escape each, not one a card)."""
    return None if agent_id is None else inert(agent_id)


def _remember_scopes(pending: PendingRequest) -> list[str]:
    """Where an answer that picks options may be remembered: [] when the asker opted out (or a plan review)."""
    if not pending.rememberable or any(item.intent is not None for item in pending.request.questions):
        return _REMEMBER_SCOPES[2]
    return _REMEMBER_SCOPES[0] if pending.agent_id else _REMEMBER_SCOPES[1]


def readonly_view(request_id: str, request: AskUserQuestionRequest, created_ms: int) -> dict[str, Any]:
    """A pending request another provider serves, listed read-only: who asks what, no form."""
    return {
        "id": request_id,
        "agent": shown_agent(request.agent),
        "createdMs": created_ms,
        "priority": request.priority,
        "questions": [
            {
                "id": item.id,
                "question": inert(item.question),
                "header": None if item.header is None else inert(item.header),
                "options": [inert(label) for label in item.labels],
            }
            for item in request.questions
        ],
    }
