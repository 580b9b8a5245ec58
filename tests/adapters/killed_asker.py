"""The restart test every adapter passes: an asking process killed while its card waits, started again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, AskUserQuestionItem, Broker
from broker.operating.housekeeping import reap_abandoned
from tests.workers.procs import start_module


async def answered_after_a_kill(
    make_broker: Callable[..., Awaitable[Broker]],
    url: str,
    namespace: str,
    script: str,
    saved: Path,
    restarted: dict[str, Any],
    answer: Callable[[AskUserQuestionItem], AskUserQuestionAnswerItem],
) -> Any:
    """Start ``script`` (tests/adapters/*_restart.py, which keeps its run in ``saved``) and SIGKILL it once its
    card shows: no chance to withdraw. Started again, it prints ``restarted`` first, then asks under the same
    key and re-attaches to that card (no second card comes). The card answered with ``answer``, the process
    ends 0; returns its last line, decoded."""

    async def asker_process() -> asyncio.subprocess.Process:
        return await start_module(script, str(saved), url=url, namespace=namespace)

    broker = await make_broker()
    async with broker.provider("test-human") as provider:
        seen = aiter(provider)
        killed = await asker_process()
        pending = await asyncio.wait_for(anext(seen), 30)
        assert saved.exists()  # noqa: ASYNC240 (one stat of a local file)
        killed.kill()
        await killed.wait()
        again = await asker_process()
        assert again.stdout is not None
        assert json.loads(await asyncio.wait_for(again.stdout.readline(), 30)) == restarted
        await asyncio.sleep(1.0)
        await reap_abandoned(broker)
        assert [asker.request_id for asker in pending.askers] == [pending.request_id]  # re-attached, not a second card
        (item,) = pending.request.questions
        await pending.answer(AskUserQuestionAnswer(answers=(answer(item),)), by="alice")
        out, err = await asyncio.wait_for(again.communicate(), 30)
        with pytest.raises(TimeoutError):  # and no second card came
            await asyncio.wait_for(anext(seen), 0.5)
    assert again.returncode == 0, err.decode()
    return json.loads(out.decode().splitlines()[-1])


def approved(item: AskUserQuestionItem) -> AskUserQuestionAnswerItem:
    return AskUserQuestionAnswerItem(id=item.id, selected=("Approve",))


def approved_with_path(path: str) -> Callable[[AskUserQuestionItem], AskUserQuestionAnswerItem]:
    """Approve with the call's arguments edited to ``{"path": path}``."""

    def answer(item: AskUserQuestionItem) -> AskUserQuestionAnswerItem:
        return AskUserQuestionAnswerItem(id=item.id, selected=("Approve",), edited={"path": path})

    return answer
