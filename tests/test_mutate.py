"""The mutation catalogue is well-formed: every snippet occurs once, every named test exists.

Fast and without Redis, so an edit that moves a snippet (the client is being rewritten) shows
up here, per mutant, before anyone runs ``make mutate``.
"""

from __future__ import annotations

import re

import pytest

from tests.mutate import ROOT, CatalogueError, Mutant, apply, copy_tree, load, mutated

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
