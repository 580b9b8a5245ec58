"""What settle.lua costs Redis per settled asker of a coalesced card: ``python -m benchmarks.settle_instructions``.

A private redis-server holds N pending requests (the stream entries read by the group, the request hashes) and
they are settled as a provider settles a card of N askers: settle.lua in calls of 256 settlements
(broker/answering/settling.py ``_SETTLE_BATCH``), each asker's own outcome (about the size of a sealed one), notice
and audit entry. Printed per asker: the Redis commands (``INFO commandstats``, those scripts run included), Redis's
CPU, and with ``--callgrind`` the instructions Redis ran (valgrind's callgrind, counted from after the set-up to after
the last call), which load does not change: docs/benchmarks-budget.md compares scripts by them.
"""

from __future__ import annotations

import argparse
import glob
import json
import socket
import subprocess
import tempfile
import time
from typing import Any, cast

from redis import Redis
from redis.exceptions import ConnectionError

from broker._lua import SCRIPTS

NS = "{bench}"
PER_CALL = 256
OUTCOME = json.dumps(
    {"answer": {"answers": [{"id": "q1", "selected": ["Yes"]}]}, "seal": {"sig": "x" * 88, "path": ["y" * 44] * 13}}
)
ASKED = json.dumps({"agent": "a", "questions": [{"id": "q1", "question": "Deploy to production now?"}]})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pending(redis: Redis, n: int) -> None:
    """N asks on the stream, read by the group, each with its pending request hash."""
    redis.set(f"qb:{NS}:provider", "1:tok:bench")
    redis.xgroup_create(f"qb:{NS}:requests", "providers", id="0", mkstream=True)
    pipe = redis.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(f"qb:{NS}:requests", {"kind": "ask", "rid": f"r{i:06d}", "request": ASKED})
    entries = pipe.execute()
    redis.xreadgroup("providers", "c", {f"qb:{NS}:requests": ">"}, count=n)
    pipe = redis.pipeline(transaction=False)
    for i in range(n):
        request = f"qb:{NS}:req:r{i:06d}"
        pipe.hset(request, mapping={"state": "pending", "entry": entries[i], "client": f"c{i % 80}", "remember": "1"})
        pipe.pexpire(request, 600_000)
    pipe.execute()


def _settle_card(redis: Redis, sha: str, n: int) -> None:
    for start in range(0, n, PER_CALL):
        keys = [f"qb:{NS}:{name}" for name in ("provider", "requests", "audit", "decisions", "decision_expiry")]
        argv: list[Any] = ["1:tok:", "bench", 1, "providers", 10_000, 60_000, "0"]
        for i in range(start, min(n, start + PER_CALL)):
            rid = f"r{i:06d}"
            request = f"qb:{NS}:req:{rid}"
            keys += [request, f"qb:{NS}:ans:{rid}", f"qb:{NS}:inbox:c{i % 80}", request]
            argv += [rid, "answered", OUTCOME, "bench", f"call-{i}", "verified", ASKED, "", 0 if i == 0 else -1]
        reply: Any = redis.evalsha(sha, len(keys), *keys, *argv)
        assert reply[0] == "ok" and all(one[0] == "ok" for one in reply[1]), reply


def _commands(redis: Redis) -> int:
    stats = cast(dict[str, dict[str, int]], redis.info("commandstats"))  # the sync client's stubs say "or an Awaitable"
    return sum(stat["calls"] for name, stat in stats.items() if not name.endswith("info"))


def measure(n: int, *, callgrind: bool) -> dict[str, float]:
    port = _free_port()
    out = tempfile.mkdtemp(prefix="settle-cg-")
    server = ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    if callgrind:
        server = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", *server]
    process = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redis = Redis(port=port, decode_responses=True)
    try:
        for _ in range(300):
            try:
                redis.ping()
                break
            except ConnectionError:
                time.sleep(0.1)
        sha = cast(str, redis.script_load(SCRIPTS["settle"].source))
        _pending(redis, n)
        commands, cpu = _commands(redis), _cpu(redis)
        if callgrind:
            subprocess.run(["callgrind_control", "-z", str(process.pid)], stdout=subprocess.DEVNULL, check=True)
        _settle_card(redis, sha, n)
        if callgrind:
            subprocess.run(["callgrind_control", "-d", str(process.pid)], stdout=subprocess.DEVNULL, check=True)
        figures = {"commands": (_commands(redis) - commands) / n, "redis_cpu_us": (_cpu(redis) - cpu) * 1e6 / n}
    finally:
        process.terminate()
        process.wait()
    if callgrind:
        (dump,) = glob.glob(f"{out}/cg.{process.pid}.1")
        with open(dump) as lines:
            total = next(int(line.split()[1]) for line in lines if line.startswith(("summary:", "totals:")))
        figures["kilo_instructions"] = total / n / 1000
    return figures


def _cpu(redis: Redis) -> float:
    cpu = cast(dict[str, Any], redis.info("cpu"))
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--askers", type=int, default=1024, help="the card's askers (default 1024)")
    parser.add_argument("--callgrind", action="store_true", help="count Redis's instructions under valgrind")
    args = parser.parse_args()
    figures = measure(args.askers, callgrind=args.callgrind)
    print(f"settle.lua, a card of {args.askers} askers in calls of {PER_CALL}, per asker:")
    for name, value in figures.items():
        print(f"  {name}: {value:.1f}")


if __name__ == "__main__":
    main()
