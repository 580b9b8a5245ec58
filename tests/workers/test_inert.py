"""``workers.inert``: the one function every face shows asker text through (issue: what a person sees is what runs)."""

from __future__ import annotations

import json

import pytest

from workers.inert import inert, inert_json, steers

STEERING = "\x1bM\x1bE\x1b[2J\x1b]8;;https://evil\x07\x9b31m\r\u202e\u2066\u200b\ufeff\U000e0041\u2028\x7f\ud800"
"""reverse index, next line, a CSI clearing the screen, an OSC link, a C1 CSI, a CR, a bidi override and
isolate, a zero-width space, a BOM, a Unicode tag, a line separator, DEL, a lone surrogate"""


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param("\x1bM\x1bE", "\\x1bM\\x1bE", id="esc-m-esc-e"),
        pytest.param("\x1b[2Jcleared", "\\x1b[2Jcleared", id="csi"),
        pytest.param("\x1b]8;;https://evil\x07link", "\\x1b]8;;https://evil\\x07link", id="osc-hyperlink"),
        pytest.param("\x9b31m", "\\x9b31m", id="c1-csi"),
        pytest.param("safe\roverwritten", "safe\\x0doverwritten", id="carriage-return"),
        pytest.param("rm -rf /\u202e#gnp.txt", "rm -rf /\\u202e#gnp.txt", id="bidi-override"),
        pytest.param("a\u2066b\u2069", "a\\u2066b\\u2069", id="bidi-isolates"),
        pytest.param("\u200eleft\u200f", "\\u200eleft\\u200f", id="bidi-marks"),
        pytest.param("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff", id="zero-width"),
        pytest.param("tag\U000e0041\U000e0042", "tag\\U000e0041\\U000e0042", id="unicode-tags"),
        pytest.param("line\u2028para\u2029", "line\\u2028para\\u2029", id="separators"),
        pytest.param("\x7f\x00", "\\x7f\\x00", id="del-and-nul"),
    ],
)
def test_steering_characters_are_shown_as_escapes(text: str, shown: str) -> None:
    assert inert(text) == shown
    assert steers(text)
    assert not steers(inert(text))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Deploy **now**?\n\n- a\n\tb", id="markdown-newlines-tabs"),
        pytest.param("Grüße, 日本語, مرحبا, עברית", id="scripts"),
        pytest.param("👨\u200d👩\u200d👧 न\u200dि", id="zwj-zwnj"),
        pytest.param("\\x1b stays as typed", id="a-backslash"),
    ],
)
def test_ordinary_text_is_left_as_it_is(text: str) -> None:
    assert inert(text) == text
    assert not steers(text)


def test_a_crlf_line_end_is_a_line_end() -> None:
    assert inert("one\r\ntwo") == "one\ntwo"
    assert not steers("one\r\ntwo")


def test_json_stays_json_of_the_same_value() -> None:
    value = {"path": STEERING, "\u202ekey": ["\U000e0041", 1]}
    text = inert_json(value)
    assert not steers(text)
    assert json.loads(text) == value
