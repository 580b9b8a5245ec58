"""An asking process for the restart test: ``python -m tests.adapters.openai_restart STATE_FILE``.

The first run stops on a tool approval, saves the ``RunState`` to STATE_FILE and asks (keyed);
a run that finds STATE_FILE restores the state from it and asks again with the same key.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Runner, RunState, Usage, function_tool
from openai.types.responses import ResponseOutputItem

from broker_adapters import openai_agents as adapter
from tests.adapters.asker_process import asker_from_env
from tests.adapters.scripted_model import call, text

OFFLINE = RunConfig(tracing_disabled=True)


class Model_(Model):
    """Calls delete_file until a tool output comes back, then reports it: the same at every start."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        outputs = [i["output"] for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        turn: list[ResponseOutputItem] = (
            [text(f"done: {outputs[-1]}")] if outputs else [call("delete_file", {"path": "build/"}, "c1")]
        )
        return ModelResponse(output=turn, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool(needs_approval=True)
def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


async def main(saved: Path) -> None:
    earlier = saved.read_text() if saved.exists() else None  # noqa: ASYNC240 (before the loop does anything)
    agent = Agent(name="cleaner", model=Model_(), tools=[delete_file])
    broker = asker_from_env()
    async with broker, broker.agent("restart-asker") as me:
        if earlier is not None:
            state: RunState[Any] = await RunState.from_string(agent, earlier)
        else:
            first = await Runner.run(agent, "clean up", run_config=OFFLINE)
            state = first.to_state()
            await asyncio.to_thread(saved.write_text, state.to_string())
        print(json.dumps({"asking": [i.call_id for i in state.get_interruptions()]}), flush=True)
        result = await adapter.run(agent, state, asker=me, key="conversation-1", timeout=30, run_config=OFFLINE)
    print(json.dumps({"output": result.final_output}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
