"""The demo: an agent asks a plan review and a multi-select batch, and a person answers them on the page.

python -m workers.demo [--port N] [REDIS_URL]   the web page (and the worker) on a private redis-server,
                                                 with a generated password; the agent waits for you
python -m workers.demo --auto [REDIS_URL]       (or DEMO_AUTO=1) an automatic provider answers: for CI

No URL: a private redis-server; without one installed, fakeredis in-process, which only the
automatic mode can use (the page runs in processes of its own, and fakeredis lives in this one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys

from broker import (
    AskUserQuestionAnswer,
    AskUserQuestionAnswerItem,
    AskUserQuestionItem,
    AskUserQuestionOption,
    AskUserQuestionRequest,
    Broker,
    PendingRequest,
    PlanReviewIntent,
    SigningKey,
)
from broker.types import encode
from workers.embedded import EmbeddedRedis, embedded_redis

PLAN = """# Plan: rotate the API keys
1. Create new keys in the vault.
2. Roll the services one by one.
3. Revoke the old keys after 24 hours.
"""

REQUESTS = [
    AskUserQuestionRequest(
        questions=(
            AskUserQuestionItem(
                id="plan",
                question="May I run this plan?",
                detail=PLAN,
                header="Plan review",
                options=(AskUserQuestionOption(label="Approve"), AskUserQuestionOption(label="Refuse")),
                intent=PlanReviewIntent(approve="Approve"),
            ),
        )
    ),
    AskUserQuestionRequest(
        questions=(
            AskUserQuestionItem(
                id="envs",
                question="Which environments should I deploy to?",
                header="Deploy",
                multi_select=True,
                options=(
                    AskUserQuestionOption(label="staging", description="safe to break"),
                    AskUserQuestionOption(label="production"),
                    AskUserQuestionOption(label="eu-west"),
                ),
            ),
            AskUserQuestionItem(id="note", question="Anything to tell the on-call engineer?"),
        )
    ),
]


def automatic_answer(pending: PendingRequest) -> AskUserQuestionAnswer:
    """What a policy would say: approve plans, pick the first option, skip free-text questions."""
    items = []
    for item in pending.request.questions:
        intent = item.intent
        if isinstance(intent, PlanReviewIntent):
            items.append(AskUserQuestionAnswerItem(id=item.id, selected=(intent.approve,)))
        elif item.options and item.multi_select:
            items.append(
                AskUserQuestionAnswerItem(id=item.id, selected=(item.options[0].label,), custom="and nothing else")
            )
        elif item.options:
            items.append(AskUserQuestionAnswerItem(id=item.id, selected=(item.options[0].label,)))
        else:
            items.append(AskUserQuestionAnswerItem(id=item.id, selected=()))
    return AskUserQuestionAnswer(answers=tuple(items))


async def run(url: str | None, *, auto: bool = True, port: int | None = None) -> int:
    given = contextlib.nullcontext(EmbeddedRedis(url.split("@")[-1], url, None)) if url else None
    with given or embedded_redis() as redis:
        print(f"Redis: {redis.description}", flush=True)
        if not auto and redis.connect is not None:
            print(
                "The page needs a real Redis, and no redis-server is installed (apt-get install -y redis-server, "
                "or give a URL): answering automatically instead.",
                flush=True,
            )
            auto = True
        if not auto:
            return await _with_a_person(redis, port or _port())
        # The answering side signs, the asking side trusts its public key (docs/security.md):
        # a key pair made for this run, as `qbroker keys new` makes one for a namespace.
        signing_key = SigningKey.generate()
        agent_side = Broker(redis.url, "demo", connect=redis.connect, trusted_keys=[signing_key.public_text])
        ui_side = Broker(redis.url, "demo", connect=redis.connect, signing_key=signing_key)
        async with agent_side, ui_side, ui_side.provider("auto") as provider:

            async def answer_all() -> None:
                async for pending in provider:
                    print(f"provider: {pending.agent_id} asks {[q.question for q in pending.request.questions]}")
                    await pending.answer(automatic_answer(pending), by="demo-policy")

            async with asyncio.TaskGroup() as tasks, agent_side.agent("demo-agent") as agent:
                answering = tasks.create_task(answer_all())
                for request in REQUESTS:
                    answer = await agent.ask(request, timeout=10)
                    print(f"agent got: {encode(answer).decode()}")
                answering.cancel()
    return 0


async def _with_a_person(redis: EmbeddedRedis, port: int) -> int:
    """The page and the worker as `qbroker quickstart` starts them; the agent waits for a person."""
    from workers.operating.quickstart.stack import QuickstartError, TeamPlan, team

    try:
        plan = TeamPlan(
            redis_url=redis.url,
            redis_description=redis.description,
            namespace="demo",
            host="127.0.0.1",
            port=port,
            user="demo",
            directory=None,
            worker=True,
        )
        async with team(plan) as running:
            print(
                f"\nOpen {running.page_url} and sign in as {running.user}, password {running.password}\n"
                "The agent `demo-agent` asks a plan review, then a batch of two questions: answer them there.\n"
                "(Ctrl-C ends the demo; `make demo DEMO_AUTO=1` answers by itself.)\n",
                flush=True,
            )
            agent_side = Broker(redis.url, "demo", trusted_keys=[running.public_key])
            async with agent_side, agent_side.agent("demo-agent") as agent:
                for request in REQUESTS:
                    answer = await agent.ask(request)
                    print(f"agent got: {encode(answer).decode()}", flush=True)
            print(
                "\nBoth answered: the agent goes on with what you chose. For a team's own set-up, "
                "`qbroker quickstart` starts the same page and worker (docs/cli.md).",
                flush=True,
            )
    except QuickstartError as error:
        print(f"demo: {error}", file=sys.stderr)
        return 1
    return 0


def _port() -> int:
    """8080 when free, else any free port (the demo must not fail on a busy 8080)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", 8080))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", metavar="REDIS_URL", help="a Redis of your own (default: a private one)")
    parser.add_argument(
        "--auto",
        action="store_true",
        default=os.environ.get("DEMO_AUTO", "").lower() in ("1", "true", "yes", "on"),
        help="answer automatically (env DEMO_AUTO=1): for CI and tests",
    )
    parser.add_argument("--port", type=int, help="the page's port (default 8080, else a free one)")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run(args.url, auto=args.auto, port=args.port))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
