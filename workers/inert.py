"""Asker text made inert for every face: nothing an asker writes can steer a terminal, a page or Slack.

An asker is not trusted, and its text reaches people through several faces: ``qbroker provide``'s
terminal, the web page (plain fields and markdown), Slack's blocks and ``qbroker status``. Each shows it
through ``inert``, here, so that they agree on what is neutralised:

- control characters (C0 but newline and tab, DEL, C1): an escape sequence (CSI ``ESC [``, OSC
  ``ESC ]``, ``ESC M`` reverse index, ``ESC E`` next line, ...) starts with one, so none reaches a
  terminal whole; a carriage return cannot overwrite what a line said;
- invisible format characters: bidi overrides, embeddings, isolates and marks (U+202A-U+202E,
  U+2066-U+2069, U+200E, U+200F, U+061C) that reorder what is shown, zero-width spaces and joiners
  around words (U+200B, U+2060-U+2064, U+FEFF), Unicode tags (U+E0000-U+E007F, text no face shows),
  line and paragraph separators, interlinear annotations, soft hyphens, lone surrogates.

They are shown, not dropped: each becomes its escape (``\\x1b``, ``\\u202e``, ``\\U000e0041``), so the
person sees that something was there. Zero-width joiner and non-joiner (U+200C, U+200D) stay: scripts
and emoji need them, and they move nothing. A CR LF line end is a line end.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["inert", "inert_json", "steers"]

# Unicode's Cc, Cf, Cs, Zl and Zp (as of Unicode 14), but tab, newline, ZWNJ and ZWJ.
_STEERING = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e007f]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON spells a character past the BMP as its UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def steers(text: str) -> bool:
    """Whether ``text`` holds a character ``inert`` escapes."""
    return _STEERING.search(text.replace("\r\n", "\n")) is not None


def inert(text: str) -> str:
    """``text`` with every character that could steer a face shown as its escape (``\\x1b``, ``\\u202e``)."""
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return _STEERING.sub(_escape, text)


def inert_json(value: Any, *, indent: int | None = 2) -> str:
    """``value`` as JSON text a face may show or offer for editing: the same characters escaped, as JSON
    escapes, so the text still parses to ``value`` (``json.dumps`` leaves bidi controls raw)."""
    return _STEERING.sub(_json_escape, json.dumps(value, ensure_ascii=False, indent=indent))
