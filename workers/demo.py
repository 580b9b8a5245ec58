"""The demo: an agent asks a plan review and a multi-select batch; an automatic provider answers.

python -m workers.demo [REDIS_URL]   (no URL: a private redis-server, else fakeredis in-process)
"""

from __future__ import annotations

import asyncio
import contextlib
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


async def run(url: str | None) -> None:
    given = contextlib.nullcontext(EmbeddedRedis(url.split("@")[-1], url, None)) if url else None
    with given or embedded_redis() as redis:
        print(f"Redis: {redis.description}")
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


def main() -> None:
    asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else None))


if __name__ == "__main__":
    main()
