"""An asking process for the restart test: ``python -m tests.adapters.langgraph_restart DIRECTORY``.

A ``create_agent`` graph with ``HumanInTheLoopMiddleware`` whose checkpointer keeps its state in
DIRECTORY, written after every checkpoint. The first run stops on the tool's approval and asks;
a run that finds a checkpoint there continues the thread (``run_graph(graph, None, ...)``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict

from broker_adapters.langgraph import run_graph
from tests.adapters.asker_process import asker_from_env


class Model(BaseChatModel):
    """Calls delete_file until a tool result comes back, then reports it: the same at every start."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        outputs = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        if outputs:
            reply = AIMessage(content=f"done: {outputs[-1]}")
        else:
            reply = AIMessage(content="", tool_calls=[{"name": "delete_file", "args": {"path": "build/"}, "id": "c1"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool
def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


class FileSaver(InMemorySaver):
    """langgraph-checkpoint's own file option (``InMemorySaver(factory=PersistentDict)``), written out
    after every checkpoint and write as SQLite or Postgres savers do, and read back at start."""

    def __init__(self, directory: Path) -> None:
        names = iter(("storage", "writes", "blobs"))

        def factory(default: Callable[[], Any] | None = None) -> PersistentDict:
            stored = PersistentDict(default, filename=str(directory / next(names)))
            if os.path.exists(stored.filename):
                stored.load()
            return stored

        super().__init__(factory=factory)  # type: ignore[arg-type]

    def _sync(self) -> None:
        for stored in (self.storage, self.writes, self.blobs):
            assert isinstance(stored, PersistentDict)
            stored.sync()

    def put(self, *args: Any, **kwargs: Any) -> Any:
        done = super().put(*args, **kwargs)
        self._sync()
        return done

    def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        super().put_writes(config, writes, task_id, task_path)
        self._sync()


async def main(directory: Path) -> None:
    restarted = (directory / "storage").exists()
    graph = create_agent(
        Model(),
        tools=[delete_file],
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"delete_file": True})],
        checkpointer=FileSaver(directory),
    )
    config: Any = {"configurable": {"thread_id": "conversation-1"}}
    broker = asker_from_env()
    async with broker, broker.agent("restart-asker") as me:
        print(json.dumps({"restarted": restarted}), flush=True)
        prompt = None if restarted else {"messages": [{"role": "user", "content": "clean up"}]}
        state = await run_graph(graph, prompt, config, asker=me, timeout=30)
    print(json.dumps({"output": str(state["messages"][-1].content)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
