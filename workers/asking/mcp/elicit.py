"""Asking the MCP client's own user, through MCP elicitation, when the namespace has no provider.

A request becomes one form (MCP allows only flat forms of primitive fields): per question, a choice
among its option labels (``enum``; a multi-select is an array of them), plus an optional free-text
field ``<id>_other`` for the seeds' "Other" answer; a question without options is a text field. No
field is required: a question left empty is skipped. The form's content becomes an
``AskUserQuestionAnswer`` held to the same rules as a provider's answer (``check_answer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import mcp_types as types

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionRequest,
    UserQuestionError,
    check_answer,
)
from broker.errors import ASK_CANCELLED

__all__ = ["OTHER_SUFFIX", "answer_from", "form_for", "message_for", "supports_elicitation"]

OTHER_SUFFIX: Final = "_other"
_MESSAGE_CHARS: Final = 8_000


def supports_elicitation(capabilities: types.ClientCapabilities | None) -> bool:
    """The client declared form elicitation (an empty ``elicitation: {}`` is form mode, as before modes)."""
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def message_for(request: AskUserQuestionRequest) -> str:
    """The questions as text (a plan review's plan too): the form shows field titles only."""
    parts = []
    for item in request.questions:
        head = f"[{item.header}] {item.question}" if item.header else item.question
        parts.append(f"{head}\n\n{item.detail}" if item.detail else head)
    text = "\n\n---\n\n".join(parts)
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def form_for(request: AskUserQuestionRequest) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for item in request.questions:
        title = item.header or item.question
        labels = list(item.labels)
        if not labels:
            properties[item.id] = {"type": "string", "title": title, "description": item.question}
            continue
        descriptions = "; ".join(f"{o.label}: {o.description}" for o in item.options or () if o.description)
        description = item.question + (f" ({descriptions})" if descriptions else "")
        if item.multi_select:
            properties[item.id] = {
                "type": "array",
                "title": title,
                "description": description,
                "items": {"type": "string", "enum": labels},
                "uniqueItems": True,
            }
        else:
            properties[item.id] = {"type": "string", "title": title, "description": description, "enum": labels}
        properties[item.id + OTHER_SUFFIX] = {
            "type": "string",
            "title": f"{title}: other",
            "description": "an answer of your own instead" + (" (or besides the choices)" if item.multi_select else ""),
        }
    return {"type": "object", "properties": properties}


def answer_from(request: AskUserQuestionRequest, result: types.ElicitResult) -> AskUserQuestionAnswer:
    """The user's form as the request's answer; declined or dismissed: ``ASK_CANCELLED``."""
    if result.action != "accept":
        done = "declined" if result.action == "decline" else "dismissed"
        raise UserQuestionError(f"the user {done} the question in the MCP client", ASK_CANCELLED)
    content: Mapping[str, Any] = result.content or {}
    items = []
    for item in request.questions:
        value = content.get(item.id)
        other = content.get(item.id + OTHER_SUFFIX) if item.labels else value
        custom = other.strip() if isinstance(other, str) and other.strip() else None
        if not item.labels:
            selected: tuple[str, ...] = ()
        elif item.multi_select:
            selected = tuple(v for v in value if v in item.labels) if isinstance(value, list) else ()
        else:  # single-select: typed text replaces the choice
            selected = (value,) if isinstance(value, str) and value in item.labels and custom is None else ()
        items.append(AskUserQuestionAnswerItem(id=item.id, selected=selected, custom=custom))
    return check_answer(request, AskUserQuestionAnswer(answers=tuple(items)))
