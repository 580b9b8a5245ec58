"""An ask cancelled by an anyio cancel scope (Starlette, MCP SDK handlers) still withdraws.

anyio cancellation is level-triggered: while the scope is cancelled, every await in the
task is cancelled again, so the withdrawal that ``_Ask.remote()`` awaits in its
``except CancelledError`` block is itself cancelled and never reaches Redis. The
question then stays on the human's screen until a reaper finds it. ``workers/asking/mcp/service.py``
works around it by running each ask in a task of its own and cancelling that task once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio

from broker import Broker, PendingRequest
from tests.helpers import one_question


async def test_ask_cancelled_by_an_anyio_scope_withdraws(make_broker: Callable[..., Awaitable[Broker]]) -> None:
    asker, ui = await make_broker(), await make_broker()
    async with ui.provider("ui") as provider:
        delivered: asyncio.Future[PendingRequest] = asyncio.get_running_loop().create_future()

        async def show() -> None:
            async for pending in provider:
                delivered.set_result(pending)
                return

        shown = asyncio.create_task(show())

        async def ask_in_a_scope() -> None:
            with anyio.CancelScope() as scope:
                scope_holder.append(scope)
                await asker.ask(one_question())

        scope_holder: list[anyio.CancelScope] = []
        asking = asyncio.create_task(ask_in_a_scope())
        pending = await asyncio.wait_for(delivered, 10)
        scope_holder[0].cancel()
        await asking
        await shown
        await asyncio.wait_for(pending.withdrawn.wait(), 5)
