"""The mutation catalogue is well-formed: every snippet occurs once (in its ``where``), every named test exists.

Fast and without Redis, so an edit that moves a snippet (the client is being rewritten) shows
up here, per mutant, before anyone runs ``make mutate``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from tests.mutate import (
    ROOT,
    CatalogueError,
    Mutant,
    add_where,
    apply,
    copy_tree,
    definitions,
    load,
    mutated,
    region,
)

MUTANTS = load()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_the_snippet_occurs_exactly_once_and_the_mutation_changes_it(mutant: Mutant) -> None:
    assert mutated(mutant) != (ROOT / mutant.file).read_text()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_every_named_test_exists(mutant: Mutant) -> None:
    assert mutant.tests and mutant.why
    for node in mutant.tests:
        path, _, name = node.partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {re.escape(name.split('[')[0])}\(", source, re.M), node


def test_a_snippet_found_twice_or_not_at_all_is_refused() -> None:
    twice = Mutant("x", "broker/scripts/settle.lua", "redis.call", "", ("t",), "why")
    with pytest.raises(CatalogueError, match=r"occurs \d+ times"):
        mutated(twice)
    missing = Mutant("y", "broker/scripts/settle.lua", "no such text", "", ("t",), "why")
    with pytest.raises(CatalogueError, match="0 times"):
        mutated(missing)


def test_the_copy_leaves_out_the_venv_and_git_and_takes_the_mutation(tmp_path) -> None:
    tree = copy_tree(tmp_path)
    assert (tree / "broker" / "scripts" / "settle.lua").exists()
    assert not (tree / ".venv").exists() and not (tree / ".git").exists()
    apply(MUTANTS[0], tree)
    assert MUTANTS[0].replacement in (tree / MUTANTS[0].file).read_text()
    assert MUTANTS[0].original in (ROOT / MUTANTS[0].file).read_text()  # the working tree is untouched


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.where], ids=[m.id for m in MUTANTS if m.where])
def test_a_where_names_a_definition_that_holds_the_snippet_once_and_the_mutation_stays_in_it(mutant: Mutant) -> None:
    source = (ROOT / mutant.file).read_text()
    assert mutant.where in definitions(mutant.file, source)
    start, end = region(mutant, source)
    assert source.count(mutant.original, start, end) == 1
    changed = mutated(mutant)
    assert changed != source
    assert changed[:start] == source[:start] and changed[len(changed) - (len(source) - end) :] == source[end:]


_PYTHON = """\
def helper(x):
    return x + 1


class Counter:
    @property
    def one(self):
        return self.x + 1

    def two(self):
        def inner():
            return self.x + 1

        return inner()


LIMIT = 3
"""

_LUA = """\
local function first(x)
  if x then
    return x + 1
  end
end
local function second(x)
  return x + 1
end
return x + 1
"""


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "m.py").write_text(_PYTHON)
    (tmp_path / "m.lua").write_text(_LUA)
    return tmp_path


def test_with_where_a_snippet_repeated_elsewhere_in_the_file_is_found_in_that_definition(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    anywhere = Mutant("x", "m.py", "x + 1", "x - 1", ("t",), "why")
    with pytest.raises(CatalogueError, match=r"occurs 3 times in m.py, not once"):
        mutated(anywhere, tree)
    for where, line in (("helper", 1), ("Counter.two.inner", 11)):
        changed = mutated(replace(anywhere, where=where), tree).splitlines()
        assert [n for n, text in enumerate(changed) if "x - 1" in text] == [line]
    # Counter holds one and two.inner, so the snippet occurs there twice: still refused
    with pytest.raises(CatalogueError, match=r"occurs 2 times in m.py, in Counter \(lines 5-14\)"):
        mutated(replace(anywhere, where="Counter"), tree)
    # a definition's lines start at its decorator
    assert mutated(replace(anywhere, original="@property\n", replacement="", where="Counter.one"), tree)


def test_with_where_a_lua_snippet_is_found_in_that_local_function(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    assert definitions("m.lua", _LUA) == {"first": (1, 5), "second": (6, 8)}
    anywhere = Mutant("x", "m.lua", "return x + 1", "return x", ("t",), "why")
    with pytest.raises(CatalogueError, match="occurs 3 times"):
        mutated(anywhere, tree)
    for where, line in (("first", 2), ("second", 6)):
        changed = mutated(replace(anywhere, where=where), tree).splitlines()
        assert [n for n, text in enumerate(changed) if text.strip() == "return x"] == [line]


def test_a_where_that_names_no_definition_is_refused_with_the_closest_names(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    with pytest.raises(CatalogueError, match=r"no definition 'Counter.tow' in m.py; did you mean Counter.two"):
        mutated(Mutant("x", "m.py", "x + 1", "x", ("t",), "why", where="Counter.tow"), tree)
    with pytest.raises(CatalogueError, match=r"no definition 'third' in m.lua"):
        mutated(Mutant("x", "m.lua", "x + 1", "x", ("t",), "why", where="third"), tree)


def test_a_snippet_gone_from_its_definition_says_where_to_look_and_shows_the_closest_lines(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    edited = Mutant("x", "m.py", "return self.x + 2", "return 0", ("t",), "why", where="Counter.one")
    with pytest.raises(CatalogueError) as raised:
        mutated(edited, tree)
    message = str(raised.value)
    assert "occurs 0 times in m.py, in Counter.one (lines 6-8)" in message
    assert "the closest lines:\n    8:         return self.x + 1" in message
    assert "11:" not in message  # only the definition's own lines


def test_add_where_names_the_innermost_definition_and_adds_only_that_line(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    catalogue = tmp_path / "mutants.toml"
    entries = [
        ("in-a-method", "m.py", "return inner()"),
        ("in-a-nested-function", "m.py", "            return self.x + 1"),
        ("in-a-lua-function", "m.lua", "  return x + 1\\nend"),
        ("across-two-lua-blocks", "m.lua", "end\\nreturn x + 1"),
        ("in-no-definition", "m.py", "LIMIT = 3"),
    ]
    before = "# header\n" + "".join(
        f'\n[[mutant]]\nid = "{i}"\nfile = "{f}"\noriginal = "{o}"\nreplacement = ""\ntests = ["t"]\nwhy = "w"\n'
        for i, f, o in entries
    )
    catalogue.write_text(before)
    original = catalogue.read_text()
    assert add_where(catalogue, tree) == 3
    after = catalogue.read_text()
    assert [line for line in after.splitlines() if line not in original.splitlines()] == [
        'where = "Counter.two"',
        'where = "Counter.two.inner"',
        'where = "second"',
    ]
    assert [m.where for m in load(catalogue)] == ["Counter.two", "Counter.two.inner", "second", None, None]
    assert add_where(catalogue, tree) == 0 and catalogue.read_text() == after
