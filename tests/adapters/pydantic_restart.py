"""An asking process for the restart test: ``python -m tests.adapters.pydantic_restart HISTORY_FILE``.

The first run stops on a tool approval, saves the message history to HISTORY_FILE and asks (keyed);
a run that finds HISTORY_FILE resumes from that history and asks again with the same key.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from broker_adapters import pydantic_ai as adapter
from tests.adapters.asker_process import asker_from_env


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls delete_file until a tool result comes back, then reports it: the same at every start."""
    outputs = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if outputs:
        return ModelResponse(parts=[TextPart(f"done: {outputs[-1]}")])
    return ModelResponse(parts=[ToolCallPart("delete_file", {"path": "build/"}, tool_call_id="c1")])


agent: Agent[None, str | DeferredToolRequests] = Agent(FunctionModel(model), output_type=[str, DeferredToolRequests])


@agent.tool_plain(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


async def main(saved: Path) -> None:
    earlier = saved.read_bytes() if saved.exists() else None  # noqa: ASYNC240 (before the loop does anything)
    broker = asker_from_env()
    async with broker, broker.agent("restart-asker") as me:
        if earlier is not None:
            history = ModelMessagesTypeAdapter.validate_json(earlier)
        else:
            first = await agent.run("clean up")
            history = first.all_messages()
            await asyncio.to_thread(saved.write_bytes, ModelMessagesTypeAdapter.dump_json(history))
        waiting = [p.tool_call_id for p in history[-1].parts if isinstance(p, ToolCallPart)]
        print(json.dumps({"asking": waiting}), flush=True)
        # No prompt: the run goes on from the saved history, whose last response holds the pending call.
        result = await adapter.run(agent, None, asker=me, key="conversation-1", timeout=30, message_history=history)
    print(json.dumps({"output": result.output}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
