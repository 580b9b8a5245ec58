"""Run the mutation catalogue (tests/mutants.toml): every mutant must be caught by its tests.

    python -m tests.mutate            # every mutant
    python -m tests.mutate --list     # the catalogue
    python -m tests.mutate --only ID  # one (repeatable)

For each mutant the working tree (without .venv, .git and caches) is copied to a temporary
directory, the mutation applied there (a snippet that is not found exactly once is an error),
and the named tests run in the copy with ``PYTHONPATH=<copy>``, so ``import broker`` and every
worker subprocess load the mutated code; this is checked before the mutant's tests run.
A mutant is caught when a test fails or the run passes its wall-clock limit (a hang). The
named tests are first run once on an unmutated copy: a test that fails there proves nothing.
Exit status: 0 when every mutant is caught, 1 when one survived, 2 on a broken catalogue.
"""

from __future__ import annotations

import argparse
import os
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


def mutated(mutant: Mutant, tree: Path = ROOT) -> str:
    """The mutated text of the mutant's file in ``tree``."""
    source = (tree / mutant.file).read_text()
    count = source.count(mutant.original)
    if count != 1:
        raise CatalogueError(f"{mutant.id}: the original snippet occurs {count} times in {mutant.file}, not once")
    return source.replace(mutant.original, mutant.replacement)


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
    parser.add_argument("-v", "--verbose", action="store_true", help="print the test output of each run")
    args = parser.parse_args(argv)

    try:
        mutants = load()
    except (CatalogueError, KeyError, tomllib.TOMLDecodeError) as error:
        print(f"broken catalogue: {error}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.id:45} {m.file:32} {m.why}")
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
