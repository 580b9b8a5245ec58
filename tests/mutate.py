"""Run the mutation catalogue (tests/mutants.toml): every mutant must be caught by its tests.

    python -m tests.mutate            # every mutant
    python -m tests.mutate --list     # the catalogue
    python -m tests.mutate --only ID  # one (repeatable)
    python -m tests.mutate --add-where  # name the definition (`where`) of entries without one

For each mutant the working tree (without .venv, .git and caches) is copied to a temporary
directory, the mutation applied there (a snippet that is not found exactly once is an error;
with ``where`` it is looked for only inside that definition: see ``region``),
and the named tests run in the copy with ``PYTHONPATH=<copy>``, so ``import broker`` and every
worker subprocess load the mutated code; this is checked before the mutant's tests run.
A mutant is caught when a test fails or the run passes its wall-clock limit (a hang). The
named tests are first run once on an unmutated copy: a test that fails there proves nothing.
Exit status: 0 when every mutant is caught, 1 when one survived, 2 on a broken catalogue.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tests" / "mutants.toml"
_SKIP = {".venv", ".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules"}
_DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    why: str
    timeout: float = _DEFAULT_TIMEOUT
    where: str | None = None


class CatalogueError(Exception):
    pass


def load(path: Path = CATALOGUE) -> list[Mutant]:
    with path.open("rb") as f:
        entries = tomllib.load(f).get("mutant", [])
    mutants = [
        Mutant(
            id=e["id"],
            file=e["file"],
            original=e["original"],
            replacement=e["replacement"],
            tests=tuple(e["tests"]),
            why=e["why"],
            timeout=float(e.get("timeout", _DEFAULT_TIMEOUT)),
            where=e.get("where"),
        )
        for e in entries
    ]
    ids = [m.id for m in mutants]
    if len(ids) != len(set(ids)):
        raise CatalogueError("duplicate mutant ids")
    return mutants


def copy_tree(destination: Path) -> Path:
    tree = destination / "tree"
    shutil.copytree(ROOT, tree, ignore=lambda _dir, names: [n for n in names if n in _SKIP], symlinks=True)
    return tree


def python_definitions(source: str) -> dict[str, tuple[int, int]]:
    """Every class and function by dotted name ("Class.method", "outer.inner"): its 1-based lines.

    A definition's lines start at its first decorator, so a mutant may name one."""
    found: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                found.setdefault(name, (first, child.end_lineno or child.lineno))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


_LUA_FUNCTION = re.compile(r"^(\s*)local function ([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def lua_definitions(source: str) -> dict[str, tuple[int, int]]:
    """Every ``local function NAME`` block: from its line to the first ``end`` at its indentation."""
    lines = source.splitlines()
    found: dict[str, tuple[int, int]] = {}
    for number, line in enumerate(lines, 1):
        match = _LUA_FUNCTION.match(line)
        if not match:
            continue
        closing = match.group(1) + "end"
        last = next((n for n in range(number + 1, len(lines) + 1) if lines[n - 1].rstrip() == closing), None)
        if last is not None:
            found.setdefault(match.group(2), (number, last))
    return found


def definitions(file: str, source: str) -> dict[str, tuple[int, int]]:
    if file.endswith(".py"):
        return python_definitions(source)
    if file.endswith(".lua"):
        return lua_definitions(source)
    return {}


def region(mutant: Mutant, source: str) -> tuple[int, int]:
    """The character range of ``source`` the snippet is looked for in: the file, or ``where``'s lines."""
    if mutant.where is None:
        return 0, len(source)
    spans = definitions(mutant.file, source)
    if mutant.where not in spans:
        close = difflib.get_close_matches(mutant.where, spans, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CatalogueError(f"{mutant.id}: no definition {mutant.where!r} in {mutant.file}{hint}")
    return _characters(source, *spans[mutant.where])


def _characters(source: str, first: int, last: int) -> tuple[int, int]:
    """Lines ``first`` to ``last`` (1-based, inclusive) as a character range, the last newline included."""
    starts = [0, *(m.end() for m in re.finditer("\n", source))]
    return starts[first - 1], starts[last] if last < len(starts) else len(source)


def _closest_lines(mutant: Mutant, source: str, start: int, end: int) -> str:
    """The lines in the region most like the snippet, numbered as in the file: what to mend it with.

    A snippet of one line gets the three most like it; a longer one, the run of as many lines most
    like it as a whole (lines repeated in the code would crowd out the one that was edited)."""
    wanted = [line.strip() for line in mutant.original.strip("\n").splitlines()]
    offset = source.count("\n", 0, start) + 1
    lines = source[start:end].splitlines()
    width = min(len(wanted), len(lines))

    def likeness(n: int) -> float:
        window = [line.strip() for line in lines[n : n + width]]
        return difflib.SequenceMatcher(None, "\n".join(wanted), "\n".join(window)).ratio()

    scored = sorted(((likeness(n), n) for n in range(len(lines) - width + 1)), reverse=True)
    if width == 1:
        shown = sorted(n for ratio, n in scored[:3] if ratio >= 0.4)
    else:
        shown = list(range(scored[0][1], scored[0][1] + width)) if scored and scored[0][0] >= 0.4 else []
    if not shown:
        return ""
    return "; the closest lines:\n" + "\n".join(f"    {offset + n}: {lines[n]}" for n in shown)


def mutated(mutant: Mutant, tree: Path = ROOT) -> str:
    """The mutated text of the mutant's file in ``tree``."""
    source = (tree / mutant.file).read_text()
    start, end = region(mutant, source)
    count = source.count(mutant.original, start, end)
    if count != 1:
        inside = mutant.file
        if mutant.where:
            first, last = source.count("\n", 0, start) + 1, source.count("\n", 0, end)
            inside += f", in {mutant.where} (lines {first}-{last})"
        closest = _closest_lines(mutant, source, start, end) if count == 0 else ""
        raise CatalogueError(f"{mutant.id}: the original snippet occurs {count} times in {inside}, not once{closest}")
    at = source.index(mutant.original, start, end)
    return source[:at] + mutant.replacement + source[at + len(mutant.original) :]


def innermost(mutant: Mutant, tree: Path = ROOT) -> str | None:
    """The innermost definition holding the mutant's snippet (found once in its file), if any."""
    source = (tree / mutant.file).read_text()
    if source.count(mutant.original) != 1:
        return None
    at = source.index(mutant.original)
    holding = []
    for name, lines in definitions(mutant.file, source).items():
        start, end = _characters(source, *lines)
        if start <= at and at + len(mutant.original) <= end:
            holding.append((end - start, name))
    return min(holding)[1] if holding else None


def add_where(path: Path = CATALOGUE, tree: Path = ROOT) -> int:
    """Add ``where = "..."`` after the ``file`` line of each entry without one; the rest stays byte for byte."""
    mutants = load(path)
    lines = path.read_text().splitlines(keepends=True)
    out: list[str] = []
    entry = -1
    waiting = False  # for this entry's ``file`` line
    added = 0
    for line in lines:
        out.append(line)
        if line.rstrip() == "[[mutant]]":
            entry, waiting = entry + 1, True
        elif waiting and line.startswith("file = "):
            waiting = False
            m = mutants[entry]
            name = None if m.where else innermost(m, tree)
            if name:
                out.append(f'where = "{name}"\n')
                added += 1
    if entry + 1 != len(mutants):
        raise CatalogueError(f"found {entry + 1} [[mutant]] headers for {len(mutants)} entries; nothing written")
    text = "".join(out)
    after = tomllib.loads(text).get("mutant", [])
    if [{k: v for k, v in e.items() if k != "where"} for e in after] != [
        {k: v for k, v in e.items() if k != "where"} for e in tomllib.loads(path.read_text()).get("mutant", [])
    ]:
        raise CatalogueError("adding `where` would change another field; nothing written")
    path.write_text(text)
    return added


def apply(mutant: Mutant, tree: Path) -> None:
    (tree / mutant.file).write_text(mutated(mutant, tree))


def environment(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports(tree: Path) -> None:
    """``broker``, ``workers`` and ``tests`` must come from the copy, here and in subprocesses."""
    probe = "import broker, workers, tests; print(broker.__file__); print(workers.__file__); print(tests.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tree, env=environment(tree), capture_output=True, text=True, timeout=60
    )
    paths = done.stdout.split()
    if done.returncode != 0 or len(paths) != 3 or not all(Path(p).is_relative_to(tree) for p in paths):
        raise CatalogueError(f"the copy at {tree} is not what gets imported: {done.stdout}{done.stderr}")


def run_tests(tree: Path, tests: tuple[str, ...], limit: float) -> tuple[str, float, str]:
    """Run ``tests`` in the copy: ('passed' | 'failed' | 'timeout' | 'error', seconds, output tail)."""
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    process = subprocess.Popen(
        command,
        cwd=tree,
        env=environment(tree),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so a hang is killed with every worker it spawned
    )
    try:
        out, _ = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        out, _ = process.communicate()
        return "timeout", time.monotonic() - started, out[-2000:]
    elapsed = time.monotonic() - started
    verdict = {0: "passed", 1: "failed"}.get(process.returncode, "error")
    return verdict, elapsed, out[-2000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--only", action="append", metavar="ID", help="run only this mutant (repeatable)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated tree")
    parser.add_argument("--add-where", action="store_true", help="add `where` to entries without one and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the test output of each run")
    args = parser.parse_args(argv)

    try:
        mutants = load()
    except (CatalogueError, KeyError, tomllib.TOMLDecodeError) as error:
        print(f"broken catalogue: {error}", file=sys.stderr)
        return 2
    if args.add_where:
        print(f"added `where` to {add_where()} entries")
        return 0
    if args.list:
        for m in mutants:
            print(f"{m.id:45} {m.file + (':' + m.where if m.where else ''):60} {m.why}")
        return 0
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            print(f"unknown mutant ids: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m.id in args.only]

    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="qb-mutate-") as scratch:
        base = copy_tree(Path(scratch) / "baseline")
        try:
            check_imports(base)
            for m in mutants:  # every snippet is checked before anything runs
                mutated(m)
        except CatalogueError as error:
            print(f"broken catalogue: {error}", file=sys.stderr)
            return 2
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
            verdict, elapsed, out = run_tests(base, tests, max(m.timeout for m in mutants) * 2)
            print(f"baseline: {len(tests)} tests on the unmutated tree {verdict} in {elapsed:.1f}s", flush=True)
            if verdict != "passed":
                print(out, file=sys.stderr)
                return 2
        for m in mutants:
            tree = copy_tree(Path(scratch) / m.id)
            apply(m, tree)
            check_imports(tree)
            verdict, elapsed, out = run_tests(tree, m.tests, m.timeout)
            outcome = {"failed": "caught", "timeout": "caught (hung)", "passed": "SURVIVED"}.get(verdict, "ERROR")
            results[m.id] = outcome
            print(f"{outcome:14} {m.id:45} {elapsed:6.1f}s  {m.why}", flush=True)
            if args.verbose or outcome in ("SURVIVED", "ERROR"):
                print("    " + out.strip().replace("\n", "\n    "), flush=True)
            shutil.rmtree(tree.parent, ignore_errors=True)

    caught = sum(r.startswith("caught") for r in results.values())
    print(f"{caught} of {len(results)} mutants caught")
    if any(r == "ERROR" for r in results.values()):
        return 2
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
