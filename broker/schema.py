"""JSON Schemas of the wire types, generated from the msgspec types (DESIGN.md invariant 8).

``python -m broker.schema docs/schema`` writes one self-contained schema per wire type
(``<TypeName>.json``, JSON Schema 2020-12) so that a UI worker or an agent written in
another language can validate what it reads and writes. ``tests/test_schema.py`` fails
when the committed files are stale.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from .errors import ErrorPayload
from .types import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionIntent,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Attachment,
    Editable,
    Outcome,
    PlanReviewIntent,
)

__all__ = ["WIRE_TYPES", "render", "schemas", "write"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"

WIRE_TYPES: tuple[type[Any], ...] = (
    AskUserQuestionRequest,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionIntent,
    PlanReviewIntent,
    Editable,
    Attachment,
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    ErrorPayload,
    Outcome,
)
"""Every type that crosses the wire; each gets ``docs/schema/<name>.json``."""

_DESCRIPTIONS = {
    "AskUserQuestionRequest": "A batch of questions, optionally from a named agent (its id).",
    "AskUserQuestionItem": "One question of a request; `id` is caller-chosen and echoed in the answer.",
    "AskUserQuestionOption": "One selectable answer; `label` is both what a human sees and the value returned.",
    "AskUserQuestionIntent": (
        "A presentation intent, tagged by `kind`. A UI that does not know a kind renders the generic "
        "option list; an intent never changes how the answer is encoded."
    ),
    "PlanReviewIntent": (
        "A plan submitted for review (the plan markdown is the question's `detail`); `approve` names, "
        "by label, the option that approves, every other option declines."
    ),
    "Editable": (
        "A tool call's arguments (a JSON object) the human may edit before approving. `approve` names, by "
        "label, the option an edit goes with; `schema`, where known, is the tool's JSON Schema for its "
        "arguments, which an edit must satisfy (the arguments as given are not checked against it)."
    ),
    "Attachment": (
        "The whole of a text a question's `detail` shows cut (a tool call's arguments), kept by the broker "
        "under its SHA-256 (`sha256`, 64 lowercase hex digits; `size`: its UTF-8 bytes). A UI fetches it when "
        "the human asks, and shows it only if its bytes hash to `sha256`."
    ),
    "AskUserQuestionAnswer": "The human's answer: one item per question, in question order.",
    "AskUserQuestionAnswerItem": (
        'The answer to one question: chosen labels and/or free "Other" text (`custom`). Empty '
        "`selected` and no `custom` means the question was skipped. `edited`: the arguments as the human "
        "edited them, only for a question with `editable` and only with its approving option selected."
    ),
    "ErrorPayload": "A failure as it crosses the wire; route on `code`, never parse `message`.",
    "Outcome": "What a settled request leaves in its outcome key: an answer or an error.",
}


def _intent_schema() -> dict[str, Any]:
    plan_review = msgspec.json.schema(PlanReviewIntent)["$defs"]["PlanReviewIntent"]
    plan_review["description"] = _DESCRIPTIONS["PlanReviewIntent"]
    return {
        "title": "AskUserQuestionIntent",
        "description": _DESCRIPTIONS["AskUserQuestionIntent"],
        "oneOf": [
            plan_review,
            {
                "title": "OtherIntent",
                "description": "An intent of another kind: its other fields are kept and passed on unchanged.",
                "type": "object",
                "properties": {"kind": {"type": "string", "not": {"const": "plan-review"}}},
                "required": ["kind"],
            },
        ],
    }


def _schema_hook(type_: type[Any]) -> dict[str, Any]:
    if type_ is AskUserQuestionIntent:
        return _intent_schema()
    raise NotImplementedError(type_)


def _describe(components: dict[str, Any]) -> None:
    for name, component in components.items():
        if name in _DESCRIPTIONS:  # markdown for readers of other languages, not the docstrings' RST
            component["description"] = _DESCRIPTIONS[name]


def _name(type_: type[Any]) -> str:
    return type_.__name__


def schemas() -> dict[str, dict[str, Any]]:
    """One self-contained JSON Schema per wire type, by type name."""
    result: dict[str, dict[str, Any]] = {}
    for type_ in WIRE_TYPES:
        name = _name(type_)
        if type_ is AskUserQuestionIntent:
            body: dict[str, Any] = _intent_schema()
        else:
            generated = msgspec.json.schema(type_, schema_hook=_schema_hook)
            defs: dict[str, Any] = generated["$defs"]
            _describe(defs)
            body = {"$ref": f"#/$defs/{name}", "$defs": dict(sorted(defs.items()))}
        result[name] = {"$schema": DIALECT, "$id": f"{name}.json", "title": name, **body}
    return result


def render(schema: dict[str, Any]) -> str:
    """The file text: stable key order as generated, two-space indent, trailing newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write(directory: Path) -> list[Path]:
    """Write every schema into ``directory`` (created if missing); returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in schemas().items():
        path = directory / f"{name}.json"
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write("usage: python -m broker.schema DIRECTORY   (e.g. docs/schema)\n")
        return 2
    for path in write(Path(args[0])):
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
