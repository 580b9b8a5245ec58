"""Each Lua script's contract header against its Python binding, and its helpers included explicitly.

A header names each of its script's KEYS and ARGV, one a line: ``-- KEYS[2] requests  the requests stream``
(ask.lua: ``-- KEYS[2] k.request ...``); an item repeated per entry is numbered from the entry's first,
``-- KEYS[k + 1] record ...``. broker/_scripts/ binds each script: its keyword parameters (a record's
fields in its place) are those names, KEYS annotated ``Key``, each in the header's order. Each binding is
called here with every item set to its own name, and what it would send is compared with the header.

broker/_lua.py loads every script; each names the helpers it uses (``--! include _audit``) and the
include line is replaced by the helper's code, so that a script's line numbers are its file's.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest

from broker import _lua
from broker._commands import Commands
from broker._lua import SCRIPTS, Script, helpers_of
from broker._scripts import BINDINGS

SCRIPT_DIR = Path(__file__).resolve().parent.parent / "broker" / "scripts"
FILES = sorted(SCRIPT_DIR.glob("*.lua"))
NAMES = [path.stem for path in FILES if not path.stem.startswith("_")]
HELPERS = [path.stem for path in FILES if path.stem.startswith("_")]


def _defined(helper: str) -> set[str]:
    return set(re.findall(r"^local function (\w+)\(", (SCRIPT_DIR / f"{helper}.lua").read_text(), re.M))


def _calls(source: str, function: str) -> bool:
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("--"))
    return re.search(rf"(?<![\w.]){function}\(", code) is not None


def test_every_script_file_is_loaded() -> None:
    assert sorted(SCRIPTS) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES + HELPERS)
def test_a_script_includes_exactly_the_helpers_it_calls(name: str) -> None:
    source = (SCRIPT_DIR / f"{name}.lua").read_text()
    calls = {helper for helper in HELPERS if helper != name and any(_calls(source, f) for f in _defined(helper))}
    assert set(helpers_of(source)) == calls


@pytest.mark.parametrize("name", NAMES)
def test_an_include_line_becomes_the_helpers_code_on_that_line(name: str) -> None:
    """The loaded script has the file's lines, each include replaced by its helper's code."""
    file_lines = (SCRIPT_DIR / f"{name}.lua").read_text().split("\n")
    loaded = SCRIPTS[name].source.split("\n")
    assert len(loaded) == len(file_lines)
    for file_line, line in zip(file_lines, loaded, strict=True):
        if file_line.startswith("--! include "):
            helper = file_line.removeprefix("--! include ")
            assert all(f"local function {function}(" in line for function in _defined(helper))
        else:
            assert line == file_line
    assert "--! include" not in SCRIPTS[name].source


_ITEM = re.compile(r"^-- (KEYS|ARGV)\[(?:(\d+)|[a-z](?: \+ (\d+))?)\]\s+(?:[ka]\.)?(\w+)", re.M)


@dataclasses.dataclass
class Header:
    """A script's contract header: its KEYS and ARGV names at fixed indices, and those repeated per entry."""

    text: str
    fixed: dict[str, list[str]]
    repeated: dict[str, list[str]]


def header(name: str) -> Header:
    lines = (SCRIPT_DIR / f"{name}.lua").read_text().split("\n")[1:]
    text = "\n".join(line for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("--"))])
    found: dict[str, dict[str, list[tuple[int, str]]]] = {"fixed": {}, "repeated": {}}
    for kind, index, offset, item in _ITEM.findall(text):
        part, at = ("fixed", int(index)) if index else ("repeated", int(offset or 0))
        found[part].setdefault(kind, []).append((at, item))
    for part, first in (("fixed", 1), ("repeated", 0)):
        for kind, items in found[part].items():
            assert [at for at, _ in items] == list(range(first, first + len(items))), (
                f"{name}: {part} {kind} out of order"
            )
    fixed = {kind: [item for _, item in found["fixed"].get(kind, [])] for kind in ("KEYS", "ARGV")}
    repeated = {kind: [item for _, item in found["repeated"].get(kind, [])] for kind in ("KEYS", "ARGV")}
    return Header(text, fixed, repeated)


def _is_key(hint: Any) -> bool:
    if typing.get_origin(hint) is Annotated:
        return "KEYS" in hint.__metadata__
    return any(_is_key(arg) for arg in typing.get_args(hint))


def _hints(target: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(target, localns={"Commands": Commands}, include_extras=True)
    hints.pop("return", None)
    hints.pop("commands", None)
    return hints


def _struct(hint: Any) -> type[msgspec.Struct] | None:
    """The record type of a parameter that takes one (ask.lua's AskKeys, ...), or of an optional one."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def _entries(hint: Any) -> type[msgspec.Struct] | None:
    """The record type of a parameter that takes a list of them (deliver.lua's entries, ...)."""
    if typing.get_origin(hint) is not collections.abc.Sequence:
        return None
    return _struct(typing.get_args(hint)[0])


def _is_list(hint: Any) -> bool:
    return typing.get_origin(hint) in (collections.abc.Sequence, list)


def items(name: str) -> list[tuple[str, Any]]:
    """A binding's named items in order: its parameters, a record's fields in its place (a list of records aside)."""
    found: list[tuple[str, Any]] = []
    for parameter, hint in _hints(BINDINGS[name]).items():
        record = _struct(hint)
        if record is None:
            found.append((parameter, hint))
        elif _entries(hint) is None:
            found += _hints(record).items()
    return found


def _sample(record: type[msgspec.Struct], lists: str) -> msgspec.Struct:
    """A record with each field its own name; a list field empty, or (``lists='named'``) holding its name."""
    fields = _hints(record)
    return record(**{f: ([f] if lists == "named" else []) if _is_list(h) else f for f, h in fields.items()})


class _Sent(Exception):
    pass


class Recorder:
    """A stand-in for ``Commands`` that keeps the script call a binding makes, and sends nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[Script, list[Any], list[Any]]] = []

    async def script(self, script: Script, keys: list[Any], args: list[Any], decode: Any = None) -> Any:
        self.sent.append((script, list(keys), list(args)))
        raise _Sent

    def fire_script(self, script: Script, keys: list[Any], args: list[Any]) -> None:
        self.sent.append((script, list(keys), list(args)))


def sent_by(name: str, *, one_entry: bool = False) -> tuple[list[Any], list[Any]]:
    """The KEYS and ARGV binding ``name`` sends with each item its own name (a list empty; entries: none, or one)."""
    named: dict[str, Any] = {}
    for parameter, hint in _hints(BINDINGS[name]).items():
        entry, record = _entries(hint), _struct(hint)
        if entry is not None:
            named[parameter] = [_sample(entry, "named")] if one_entry else []
        elif record is not None:
            named[parameter] = _sample(record, "empty")
        else:
            named[parameter] = [] if _is_list(hint) else parameter
    recorder = Recorder()
    call = BINDINGS[name](recorder, **named)
    if inspect.iscoroutine(call):
        with pytest.raises(_Sent):
            call.send(None)
    (script, keys, args), *more = recorder.sent
    assert script is SCRIPTS[name] and not more
    return keys, args


def test_every_script_has_one_binding() -> None:
    assert sorted(BINDINGS) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_a_binding_names_its_scripts_keys_and_argv_in_header_order(name: str) -> None:
    contract = header(name)
    binding = BINDINGS[name]
    parameters = inspect.signature(binding).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for n, p in parameters.items() if n != "commands")
    kinds = [_is_key(hint) for hint in _hints(binding).values() if _struct(hint) is None]
    assert kinds == sorted(kinds, reverse=True), "KEYS come first"
    named = items(name)
    keys = [item for item, hint in named if _is_key(hint)]
    argv = [item for item, hint in named if not _is_key(hint)]
    for kind, in_order in (("KEYS", keys), ("ARGV", argv)):
        assert in_order[: len(contract.fixed[kind])] == contract.fixed[kind]
        for rest in in_order[len(contract.fixed[kind]) :]:  # lists and optional items after the numbered ones
            assert re.search(rf"\b{rest}\b", contract.text), f"{name}.lua does not name {rest}"
    hints = dict(named)

    def sent(item: str, numbered: list[str]) -> list[Any]:
        """What an item set to its name (or to an empty list) sends: a list numbered in the header, its length."""
        if not _is_list(hints[item]):
            return [item]
        return [0] if item in numbered else []

    sent_keys, sent_args = sent_by(name)
    assert sent_keys == [value for item in keys for value in sent(item, contract.fixed["KEYS"])]
    assert sent_args == [value for item in argv for value in sent(item, contract.fixed["ARGV"])]


@pytest.mark.parametrize("name", [n for n in NAMES if any(_entries(h) for h in _hints(BINDINGS[n]).values())])
def test_a_bindings_entries_are_the_headers_repeated_items(name: str) -> None:
    """deliver.lua's five KEYS and three ARGV per entry, settle.lua's per settlement, ..."""
    contract = header(name)
    (record,) = [entry for h in _hints(BINDINGS[name]).values() if (entry := _entries(h)) is not None]
    fields = _hints(record)
    keys = [field for field, hint in fields.items() if _is_key(hint)]
    argv = [field for field in fields if field not in keys]
    assert list(fields)[: len(keys)] == keys, "KEYS come first"
    assert keys == contract.repeated["KEYS"]
    assert argv == contract.repeated["ARGV"]
    sent_keys, sent_args = sent_by(name, one_entry=True)
    assert sent_keys[len(contract.fixed["KEYS"]) :] == keys
    assert sent_args[len(contract.fixed["ARGV"]) :] == argv


def _with_helpers_of(files: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Script ``s`` of ``files`` (name to source) with the helpers it includes, read from ``files`` too."""
    monkeypatch.setattr(_lua, "_read", files.__getitem__)
    return _lua._with_helpers("s", files["s"])


def test_a_helper_may_include_another_and_each_is_included_once(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        "s": "#!lua\n--! include _b\n--! include _a\nreturn b() + a()",
        "_b": "-- b: calls a\n--! include _a\nlocal function b()\n  return a()\nend",
        "_a": "-- a\nlocal function a() return 1 end",
    }
    source = _with_helpers_of(files, monkeypatch).split("\n")
    assert source == [
        "#!lua",
        "local function a() return 1 end local function b() return a() end",
        "",
        "return b() + a()",
    ]


def test_a_helper_that_includes_itself_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        "s": "#!lua\n--! include _a\nreturn 1",
        "_a": "--! include _b\nlocal x = 1",
        "_b": "--! include _a\nlocal y = 2",
    }
    with pytest.raises(ValueError, match="includes itself"):
        _with_helpers_of(files, monkeypatch)
