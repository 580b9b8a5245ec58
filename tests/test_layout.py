"""The layout docs/architecture.md promises, kept: no product file over 500 lines, no function over 80,
no import cycle among the product modules, no private name used across modules, broker/'s sides apart.

Read with ``ast`` from the source, so it costs no Redis and no import of the code it checks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("broker", "broker_adapters", "workers")
MOST_LINES_PER_FILE = 500
MOST_LINES_PER_FUNCTION = 80
SIDES = ("broker.asking", "broker.answering", "broker.operating")
FACADE = {"broker", "broker.broker"}
"""where broker/'s sides meet: the package's exports and the ``Broker`` that builds all three"""

# The one reach-in kept on purpose, into a library rather than across our modules: reading a reply
# hiredis already holds without arming redis-py's socket timer (broker/connection.py says why).
THIRD_PARTY_REACH_INS = {("broker/connection.py", "_reader"), ("broker/connection.py", "_AsyncHiredisParser")}


def _files() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_here(tree: ast.AST) -> set[str]:
    """Every name this module defines: its functions, classes, variables and the attributes it sets on self."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _imported_from(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = _module(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def reach_ins(path: Path) -> Iterator[str]:
    """A private name of another module used here: an attribute not defined in this module, a private
    name imported, or a private module of another top-level package."""
    tree = ast.parse(path.read_text())
    here = _defined_here(tree)
    own_package = _module(path).split(".")[0]
    relative = path.relative_to(ROOT).as_posix()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in here:
            # A class's own attributes, or those it inherits (self._x, cls._x, super()._x), are its own.
            if _is_self(node.value):
                continue
            if (relative, node.attr) not in THIRD_PARTY_REACH_INS:
                yield f"{relative}:{node.lineno} .{node.attr}"
        elif isinstance(node, ast.ImportFrom):
            source = _imported_from(path, node)
            top = source.split(".")[0]
            for alias in node.names:
                full = f"{source}.{alias.name}"
                module_of_ours = (ROOT / Path(*full.split("."))).is_dir() or (
                    ROOT / f"{full.replace('.', '/')}.py"
                ).exists()
                if _private(alias.name) and not module_of_ours and (relative, alias.name) not in THIRD_PARTY_REACH_INS:
                    yield f"{relative}:{node.lineno} imports {full}"
            if top in PACKAGES and top != own_package and any(_private(part) for part in source.split(".")):
                yield f"{relative}:{node.lineno} imports from {source}"


def _imports(path: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            source = _imported_from(path, node)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                found.add(full if full in modules else source)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & modules


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while (member := stack.pop()) != module:
                group.append(member)
            if group:
                found.append(sorted([module, *group]))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_no_product_file_is_over_500_lines() -> None:
    long = {str(path.relative_to(ROOT)): n for path in _files() if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}


def test_no_function_is_over_80_lines() -> None:
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in _files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MOST_LINES_PER_FUNCTION
    ]
    assert long == []


def test_no_module_reaches_into_another_ones_private_names() -> None:
    assert [reach for path in _files() for reach in reach_ins(path)] == []


def test_the_product_modules_import_no_cycle() -> None:
    modules = {_module(path): path for path in _files()}
    graph = {module: _imports(path, set(modules)) - {module} for module, path in modules.items()}
    assert cycles(graph) == []


def _side(module: str) -> str | None:
    return next((side for side in SIDES if module == side or module.startswith(side + ".")), None)


def _runtime_imports(path: Path) -> Iterator[tuple[int, str]]:
    """Each module imported when this one runs: not those under ``if TYPE_CHECKING:``, which name types only."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and id(node) not in typing_only:
            source = _imported_from(path, node)
            for alias in node.names:
                yield node.lineno, f"{source}.{alias.name}"


def side_crossings(path: Path) -> Iterator[str]:
    """An import that runs from one side of broker/ into another, or from what the sides share up into a side."""
    here = _module(path)
    if here in FACADE or not here.startswith("broker"):
        return
    for lineno, imported in _runtime_imports(path):
        there = _side(imported)
        if there is not None and there != _side(here):
            yield f"{path.relative_to(ROOT)}:{lineno} imports {imported}"


def test_the_sides_of_broker_import_only_what_they_share() -> None:
    """asking/, answering/ and operating/ meet in ``Broker`` (broker.py) and the package's exports; a side names
    another only for a type; what they share (the top of broker/) names no side."""
    assert [crossing for path in _files() for crossing in side_crossings(path)] == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from broker._keys import Keys\n", ["imports from broker._keys"]),
        ("from broker.operating.status import _age\n", ["imports broker.operating.status._age"]),
        ("def f(broker):\n    return broker._core\n", ["._core"]),
        (
            "class A:\n    def __init__(self):\n        self._x = 1\n    def f(self, other):\n        return other._x\n",
            [],
        ),
    ],
)
def test_the_reach_in_check_sees_each_kind(tmp_path: Path, source: str, expected: list[str], monkeypatch) -> None:
    """The check itself can fail: each kind of reach-in written into a workers/ module is reported."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "workers").mkdir()
    module = tmp_path / "workers" / "probe.py"
    module.write_text(source)
    assert [reach.split(" ", 1)[1] for reach in reach_ins(module)] == expected


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("broker/answering/probe.py", "from ..asking._ask import Ask\n", ["imports broker.asking._ask.Ask"]),
        ("broker/probe.py", "from .operating import housekeeping\n", ["imports broker.operating.housekeeping"]),
        (
            "broker/answering/probe.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..asking import agents\n",
            [],
        ),
        ("broker/answering/probe.py", "from .. import audit\nfrom .lease import Lease\n", []),
    ],
)
def test_the_side_check_sees_a_crossing(
    tmp_path: Path, where: str, source: str, expected: list[str], monkeypatch
) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    module = tmp_path / where
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(source)
    assert [crossing.split(" ", 1)[1] for crossing in side_crossings(module)] == expected


def test_the_cycle_check_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
