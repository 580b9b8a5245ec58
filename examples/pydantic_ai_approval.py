"""A Pydantic AI agent whose risky tool needs a human's approval, asked through question-broker.

    pip install 'question-broker[pydantic-ai]'
    qbroker provide          # in another terminal: answer there (or qbroker web, qbroker auto)
    EXAMPLE_MODEL=openai:gpt-4o python examples/pydantic_ai_approval.py

Without EXAMPLE_MODEL it runs offline on Pydantic AI's TestModel (it calls every tool once).
QBROKER_REDIS_URL and QBROKER_NAMESPACE say where to ask.
"""

from __future__ import annotations

import asyncio
import os

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.models.test import TestModel

from broker import Broker
from broker_adapters import pydantic_ai as approvals

agent = Agent(
    os.environ.get("EXAMPLE_MODEL") or TestModel(),
    instructions="Clean up the build directory.",
    output_type=[str, DeferredToolRequests],  # lets a run stop for approval
)


@agent.tool_plain(requires_approval=True)
def delete_directory(path: str) -> str:
    """Delete a directory and everything in it."""
    return f"deleted {path}"  # (a real tool would delete it here)


async def main() -> None:
    url = os.environ.get("QBROKER_REDIS_URL", "redis://localhost:6379/0")
    namespace = os.environ.get("QBROKER_NAMESPACE", "default")
    trusted_keys = os.environ.get("QBROKER_TRUSTED_KEYS", "")  # the providers' public keys (qbroker keys new)
    async with (
        Broker(url, namespace=namespace, trusted_keys=trusted_keys) as broker,
        broker.agent("pydantic-ai-example") as me,
    ):
        result = await approvals.run(agent, "Clean up, please.", asker=me, timeout=600)
    print(result.output)


if __name__ == "__main__":
    asyncio.run(main())
