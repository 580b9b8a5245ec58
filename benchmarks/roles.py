"""The benchmark's processes: ``python -m benchmarks.roles <role> --url ... --namespace ...``.

Each role prints JSON lines on stdout (``{"event": ...}``) that the orchestrator reads.
Askers read the concurrency levels from their arguments and print one result per level.
SIGTERM cancels the role's main task, so context managers exit cleanly (a provider
releases its lease); SIGKILL is what the failover measurement uses instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from msgspec.structs import replace
from redis.asyncio import Redis

from benchmarks.keys import KEYS
from benchmarks.questions import YES, yes_or_no
from broker import (
    Broker,
    Remember,
)
from broker.connection import redis_from_url
from broker.types import PRIORITIES, decode_outcome, encode

REQUEST = yes_or_no("Apply the migration to the staging database?")
ANSWER = YES
# The same payloads as JSON, for the floor and arq (which carry opaque bytes/objects).
REQUEST_JSON = encode(REQUEST).decode()
ANSWER_JSON = encode(ANSWER).decode()


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


# -- driving asks at a fixed concurrency -------------------------------------------------


async def drive(
    call: Callable[[], Awaitable[Any]], concurrency: int, total: int, max_seconds: float, min_seconds: float = 0.0
) -> dict[str, Any]:
    """Run at least ``total`` calls and for at least ``min_seconds``, ``concurrency`` at a time.

    No new call starts after ``max_seconds``.
    """
    latencies: list[float] = []
    remaining = total
    started = time.perf_counter()
    stop_at = started + max_seconds
    busy_until = started + min(min_seconds, max_seconds)

    async def worker() -> None:
        nonlocal remaining
        while True:
            now = time.perf_counter()
            if now >= stop_at or (remaining <= 0 and now >= busy_until):
                return
            remaining -= 1
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    n = len(latencies)
    return {
        "concurrency": concurrency,
        "asks": n,
        "seconds": elapsed,
        "rate": n / elapsed if elapsed > 0 else 0.0,
        "p50_ms": latencies[n // 2] * 1000 if n else None,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000 if n else None,
    }


async def run_levels(args: argparse.Namespace, call: Callable[[], Awaitable[Any]]) -> None:
    for _ in range(min(50, args.asks)):  # warm up connections, scripts, code paths
        await call()
    # CPU per ask is counted from here: start-up, imports and the warm-up are not in it.
    emit("warmed")
    for concurrency in args.levels:
        total = max(args.asks, 4 * concurrency)
        emit("level", **await drive(call, concurrency, total, args.max_seconds, args.min_seconds))


# -- question-broker ---------------------------------------------------------------------


def without_signatures() -> None:
    """The counterfactual ``broker-unsigned`` measures: answers travel as bare outcome JSON, unsigned.

    The broker has no unsigned mode (docs/security.md); only this benchmark's own processes patch
    the provider's sealing and the asker's check out, so that one run can say what signing costs.
    """
    import broker.answering.settling
    import broker.asking._ask
    from broker.signing import Seal, SigningKey

    def bare(key: SigningKey, namespace: str, epoch: int, at: int, seals: list[Seal]) -> list[str]:
        return [seal.body for seal in seals]

    def accept(ask: broker.asking._ask.Ask, outcome: str, request_id: str | None = None) -> bool:
        ask._checked = (outcome, decode_outcome(outcome))
        return True

    broker.answering.settling.seal_outcomes = bare  # type: ignore[attr-defined]  # the name settling.py imports from signing
    broker.asking._ask.Ask.accepts = accept  # type: ignore[method-assign,assignment]  # mypy reads a plain function set on a class as taking self twice


async def broker_provider(args: argparse.Namespace) -> None:
    """An automatic provider: answers every request at once, with the public API only.

    Each answer is its own task (as a UI answering several humans would), unless ``--serial``,
    where the loop awaits each answer before taking the next request.
    """
    async with Broker(args.url, args.namespace, lease_ttl=args.lease_ttl, **KEYS) as broker:
        while True:  # a fenced provider stands by again (not expected here)
            async with (
                broker.provider(args.name, on_standby=lambda holder: emit("standby", holder=holder)) as p,
                asyncio.TaskGroup() as tasks,
            ):
                emit("holding", epoch=p.epoch, pid=os.getpid())
                remember = Remember(ttl=3600) if args.remember else None
                async for pending in p:
                    if args.serial:
                        await pending.answer(ANSWER, by="bench", remember=remember)
                    else:
                        tasks.create_task(pending.answer(ANSWER, by="bench", remember=remember))


async def broker_holder(args: argparse.Namespace) -> None:
    """Holds the lease and answers nothing, so asks are accepted and stay pending."""
    async with (
        Broker(args.url, args.namespace, lease_ttl=args.lease_ttl, **KEYS) as broker,
        broker.provider(args.name) as p,
    ):
        emit("holding", epoch=p.epoch, pid=os.getpid())
        await asyncio.Event().wait()


ASK_TIMEOUT_S = 120.0


async def broker_asker(args: argparse.Namespace) -> None:
    """Asks as a live root agent with a timeout, so the caller gate and the timeout path run.

    With ``--keyed`` every ask is a keyed ask (issue 14) under a key of its own.
    """
    async with Broker(args.url, args.namespace, **KEYS) as broker, broker.agent("bench-root") as agent:
        emit("ready")
        remember = not args.no_remember
        coalesce = not args.no_coalesce
        if args.priorities:
            async with broker.agent("bench-b") as b, broker.agent("bench-c") as c:
                turns = itertools.cycle(
                    [(who, replace(REQUEST, priority=level)) for level in PRIORITIES for who in (agent, b, c)]
                )

                def one() -> Any:
                    who, request = next(turns)
                    return who.ask(request, timeout=ASK_TIMEOUT_S, remember=remember, coalesce=coalesce)

                await run_levels(args, one)
        elif args.keyed:
            keys = itertools.count()
            await run_levels(
                args, lambda: agent.ask(REQUEST, timeout=ASK_TIMEOUT_S, key=f"k{next(keys)}", remember=remember)
            )
        else:
            await run_levels(
                args, lambda: agent.ask(REQUEST, timeout=ASK_TIMEOUT_S, remember=remember, coalesce=coalesce)
            )
    emit("done")


async def broker_waiting_asker(args: argparse.Namespace) -> None:
    """Opens a broker, waits for "go" on stdin, starts ``--waiting`` asks, reports when all are answered.

    Then it waits for another line on stdin before closing the broker.
    """
    async with Broker(args.url, args.namespace, **KEYS) as broker:
        emit("ready")
        await asyncio.to_thread(sys.stdin.readline)
        asks = [asyncio.ensure_future(broker.ask(REQUEST)) for _ in range(args.waiting)]
        emit("started", asks=len(asks))
        answers = await asyncio.gather(*asks)
        emit("answered", asks=len(answers), all_yes=all(a == ANSWER for a in answers))
        await asyncio.to_thread(sys.stdin.readline)  # "close": the residue is measured before and after
    emit("done")


# -- the raw floor -----------------------------------------------------------------------

FLOOR_GROUP = "g"


class Pipeliner:
    """Sends whatever commands are queued as one pipeline on one connection."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self.queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self.wakeup = asyncio.Event()

    async def call(self, *command: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queue.append((command, future))
        self.wakeup.set()
        return await future

    async def run(self) -> None:
        while True:
            await self.wakeup.wait()
            self.wakeup.clear()
            batch, self.queue = self.queue, []
            if not batch:
                continue
            pipe = self.client.pipeline(transaction=False)
            for command, _ in batch:
                pipe.execute_command(*command)
            for (_, future), result in zip(batch, await pipe.execute(), strict=True):
                future.set_result(result)


def floor_client(url: str, *, blocking: bool = False) -> Redis:
    """The broker's own client builder: the same hiredis parsing and packing, timeouts and retries."""
    client = redis_from_url(url, blocking=blocking)
    assert isinstance(client, Redis)
    return client


async def floor_server(args: argparse.Namespace) -> None:
    """XREADGROUP by one consumer; the answers RPUSHed to the askers' inboxes; one XACK + XDEL per batch."""
    stream = f"{args.namespace}:requests"
    client = floor_client(args.url)
    try:
        # (hiredis packs "XGROUP CREATE" as one word: the sub-command goes as its own argument)
        await client.execute_command("XGROUP", "CREATE", stream, FLOOR_GROUP, "0", "MKSTREAM")
        emit("holding", pid=os.getpid())
        while True:
            reply = await client.xreadgroup(FLOOR_GROUP, "c", {stream: ">"}, count=256, block=1000)
            for _stream, entries in reply or ():
                pipe = client.pipeline(transaction=False)
                ids = []
                for entry_id, fields in entries:
                    ids.append(entry_id)
                    pipe.rpush(f"{args.namespace}:inbox:{fields['client']}", f"{fields['rid']} {ANSWER_JSON}")
                pipe.xack(stream, FLOOR_GROUP, *ids)
                pipe.xdel(stream, *ids)
                await pipe.execute()
    finally:
        await client.aclose()


async def floor_asker(args: argparse.Namespace) -> None:
    """XADDs of concurrent asks pipelined on one connection; one BLMPOP per process, demultiplexed by id."""
    stream = f"{args.namespace}:requests"
    client_id = secrets.token_hex(8)
    inbox = f"{args.namespace}:inbox:{client_id}"
    client = floor_client(args.url)
    blocking = floor_client(args.url, blocking=True)
    pipeliner = Pipeliner(client)
    waiting: dict[str, asyncio.Future[str]] = {}

    async def wait_inbox() -> None:
        while True:
            popped = await blocking.execute_command("BLMPOP", 1, 1, inbox, "LEFT", "COUNT", 1000)
            if popped is None:
                continue
            for notice in popped[1]:
                request_id, _, answer = notice.partition(" ")
                future = waiting.pop(request_id, None)
                if future is not None:
                    future.set_result(answer)

    async def ask() -> str:
        request_id = secrets.token_hex(12)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        waiting[request_id] = future
        await pipeliner.call("XADD", stream, "*", "rid", request_id, "client", client_id, "request", REQUEST_JSON)
        return await future

    try:
        async with asyncio.TaskGroup() as tasks:
            sender = tasks.create_task(pipeliner.run())
            waiter = tasks.create_task(wait_inbox())
            emit("ready")
            await run_levels(args, ask)
            sender.cancel()
            waiter.cancel()
    finally:
        await client.aclose()
        await blocking.aclose()
    emit("done")


# -- arq ---------------------------------------------------------------------------------


async def _answer_job(ctx: dict[str, Any], request: str) -> str:
    return ANSWER_JSON


def _arq_settings(url: str) -> Any:
    from arq.connections import RedisSettings

    return RedisSettings.from_dsn(url)


async def arq_worker(args: argparse.Namespace) -> None:
    from arq.worker import Worker, func

    worker = Worker(
        functions=[func(_answer_job, name="answer")],
        queue_name=f"{args.namespace}:queue",
        redis_settings=_arq_settings(args.url),
        poll_delay=args.poll_delay,
        max_jobs=args.max_jobs,
        keep_result=60,
        handle_signals=False,
        log_results=False,
    )
    emit("holding", pid=os.getpid())
    try:
        await worker.async_run()
    finally:
        await worker.close()


async def arq_asker(args: argparse.Namespace) -> None:
    from arq.connections import create_pool

    queue = f"{args.namespace}:queue"
    pool = await create_pool(_arq_settings(args.url), default_queue_name=queue)

    async def ask() -> Any:
        job = await pool.enqueue_job("answer", REQUEST_JSON)
        assert job is not None
        return await job.result(poll_delay=args.poll_delay)

    try:
        emit("ready")
        await run_levels(args, ask)
    finally:
        await pool.aclose()
    emit("done")


ROLES: dict[str, Callable[[argparse.Namespace], Awaitable[None]]] = {
    "broker-provider": broker_provider,
    "broker-holder": broker_holder,
    "broker-asker": broker_asker,
    "broker-waiting-asker": broker_waiting_asker,
    "floor-server": floor_server,
    "floor-asker": floor_asker,
    "arq-worker": arq_worker,
    "arq-asker": arq_asker,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.roles")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", default="bench")
    parser.add_argument("--serial", action="store_true", help="broker-provider: await each answer in the loop")
    parser.add_argument("--keyed", action="store_true", help="broker-asker: every ask keyed (a key of its own)")
    parser.add_argument("--remember", action="store_true", help="broker-provider: remember each answer (namespace)")
    parser.add_argument("--no-remember", action="store_true", help="broker-asker: ask with remember=False")
    parser.add_argument("--no-coalesce", action="store_true", help="broker-asker: ask with coalesce=False")
    parser.add_argument(
        "--unsigned", action="store_true", help="broker roles: answers neither signed nor verified (a counterfactual)"
    )
    parser.add_argument(
        "--priorities", action="store_true", help="broker-asker: three agents in turn, cycling urgent, normal, low"
    )
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    parser.add_argument("--asks", type=int, default=1000)
    parser.add_argument("--max-seconds", type=float, default=10.0)
    parser.add_argument("--min-seconds", type=float, default=0.0)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--poll-delay", type=float, default=0.005)
    parser.add_argument("--max-jobs", type=int, default=4096)
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    if args.unsigned:
        without_signatures()
    task = asyncio.ensure_future(ROLES[args.role](args))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_main(parse(argv)))


if __name__ == "__main__":
    main()
