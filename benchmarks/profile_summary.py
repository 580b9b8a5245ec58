"""Summarise a py-spy ``--format raw`` profile: ``python -m benchmarks.profile_summary FILE [--rate HZ --seconds S]``.

Prints the share of samples by function, inclusive (on the stack) and self (the leaf), for the
frames in ``broker/`` and for everything, so a missed target points at named code.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^:]+):(?P<line>\d+)\)$")


def _frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for frame in stack.split(";"):
        match = _FRAME.match(frame.strip())
        if match:
            out.append((match["func"], match["file"]))
        else:
            out.append((frame.strip(), ""))
    return out


def summarise(path: Path, top: int = 25, under: str | None = None) -> str:
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    broker_self: Counter[str] = Counter()
    total = 0
    for raw in path.read_text().splitlines():
        stack, _, count_text = raw.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = _frames(stack)
        if under is not None:
            names = [func for func, _ in frames]
            if under not in names:
                continue
            frames = frames[names.index(under) :]
        seen = set()
        for func, file in frames:
            name = f"{func} ({file})"
            if name not in seen:
                inclusive[name] += count
                seen.add(name)
        func, file = frames[-1]
        leaf[f"{func} ({file})"] += count
        # the innermost broker/ frame: where broker code spends, itself or in what it calls
        for func, file in reversed(frames):
            if file.startswith("broker/") or "/broker/" in file:
                broker_self[f"{func} ({file})"] += count
                break
        else:
            broker_self["(no broker/ frame on the stack)"] += count
    scope = f", stacks under {under}: {sum(leaf.values())}" if under else ""
    lines = [f"{path}: {total} samples (active, non-idle){scope}"]
    for title, counter in (
        ("inclusive, broker/ frames", Counter({k: v for k, v in inclusive.items() if "broker/" in k})),
        ("innermost broker/ frame", broker_self),
        ("self (leaf), all code", leaf),
    ):
        lines.append(f"  -- {title}")
        for name, count in counter.most_common(top):
            lines.append(f"  {100 * count / total:5.1f}%  {name}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_summary")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--under", default=None, help="only stacks through this function (e.g. Commands._send)")
    args = parser.parse_args()
    for file in args.files:
        print(summarise(file, args.top, args.under))


if __name__ == "__main__":
    main()
