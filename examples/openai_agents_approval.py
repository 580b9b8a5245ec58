"""An OpenAI Agents SDK agent that asks the human (full request shape) and needs approval for a tool.

    pip install 'question-broker[openai-agents]'
    qbroker provide          # in another terminal: answer there (or qbroker web, qbroker auto)
    EXAMPLE_MODEL=gpt-4.1 python examples/openai_agents_approval.py     # with OPENAI_API_KEY

Without EXAMPLE_MODEL it runs offline: a scripted stand-in model asks for a plan review, then
calls the tool that needs approval. QBROKER_REDIS_URL and QBROKER_NAMESPACE say where to ask.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Usage, function_tool
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from broker import Broker
from broker_adapters import openai_agents as adapter


@function_tool(needs_approval=True)
def run_migration(name: str) -> str:
    """Run a database migration."""
    return f"migration {name} applied"  # (a real tool would run it here)


class Scripted(Model):
    """Offline stand-in for a model: ask for a plan review, run the migration, report."""

    def __init__(self) -> None:
        plan = {"id": "plan", "question": "Apply this migration plan?", "header": "DB",
                "detail": "1. add column `region`\n2. backfill", "multiSelect": False,
                "options": [{"label": "Approve", "description": None}, {"label": "Revise", "description": None}],
                "intent": {"kind": "plan-review", "approve": "Approve"}}  # fmt: skip
        self.turns: list[list[Any]] = [
            [_call("ask_user_question", {"questions": [plan]}, "c1")],
            [_call("run_migration", {"name": "0042_region"}, "c2")],
        ]

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        if self.turns:
            output = self.turns.pop(0)
        else:  # report what the last tool said
            last = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"][-1]
            said = ResponseOutputText(type="output_text", text=str(last["output"]), annotations=[])
            output = [
                ResponseOutputMessage(id="m", type="message", role="assistant", status="completed", content=[said])
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


def _call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=json.dumps(arguments))


async def main() -> None:
    url = os.environ.get("QBROKER_REDIS_URL", "redis://localhost:6379/0")
    namespace = os.environ.get("QBROKER_NAMESPACE", "default")
    trusted_keys = os.environ.get("QBROKER_TRUSTED_KEYS", "")  # the providers' public keys (qbroker keys new)
    model: str | Model = os.environ.get("EXAMPLE_MODEL") or Scripted()
    async with (
        Broker(url, namespace=namespace, trusted_keys=trusted_keys) as broker,
        broker.agent("openai-agents-example") as me,
    ):
        planner = Agent(
            name="planner",
            instructions="Get the plan reviewed with ask_user_question before running the migration.",
            model=model,
            tools=[adapter.ask_user_question_tool(me, timeout=600), run_migration],
        )
        offline = RunConfig(tracing_disabled=not os.environ.get("EXAMPLE_MODEL"))
        result = await adapter.run(planner, "Migrate the orders table.", asker=me, timeout=600, run_config=offline)
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
