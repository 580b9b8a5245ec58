"""``qbroker ask --key``: a question that outlives the asking process (kill -9, SIGTERM, restart)."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest

from broker import PendingRequest, Provider
from tests.helpers import pick
from tests.workers.procs import Worker, run_qbroker

ASK = ("ask", "--agent", "ci", "--key", "deploy-2.4.0", "-q", "Deploy 2.4.0?", "-o", "yes", "-o", "no")


async def next_pending(provider: Provider, timeout: float = 20) -> PendingRequest:
    return await asyncio.wait_for(anext(aiter(provider)), timeout)


async def asking(redis_server, namespace, *args: str) -> Worker:
    return await Worker.start(*args, url=redis_server.url, namespace=namespace)


async def killed(worker: Worker) -> None:
    worker.process.kill()  # SIGKILL: no withdrawal, no detach, nothing
    await asyncio.wait_for(worker.process.wait(), 10)
    await worker.stop()


async def test_killed_mid_question_then_answered_then_restarted_gets_the_answer(make_broker, redis_server, namespace):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await asking(redis_server, namespace, *ASK)
        pending = await next_pending(provider)
        await killed(first)
        await pending.answer(pick("yes"))
        status, out, err = await run_qbroker(*ASK, url=redis_server.url, namespace=namespace)
    assert status == 0, err
    assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["yes"]}]}


async def test_restarted_before_the_answer_it_waits_on_the_same_question(make_broker, redis_server, namespace):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await asking(redis_server, namespace, *ASK)
        pending = await next_pending(provider)
        was = first_client(pending)
        await killed(first)
        restarted = asyncio.ensure_future(run_qbroker(*ASK, url=redis_server.url, namespace=namespace))
        # re-attached: the provider is told the asker is back (a new process), and shows no second card
        async with asyncio.timeout(15):
            while client_of(pending) == was and not restarted.done():
                await asyncio.sleep(0.05)
        assert not restarted.done(), restarted.result()
        assert provider.pending == [pending]
        await pending.answer(pick("no"))
        status, out, err = await asyncio.wait_for(restarted, 20)
    assert status == 0, err
    assert json.loads(out) == {"answers": [{"id": "q1", "selected": ["no"]}]}


_FIRST_CLIENT: dict[str, str] = {}


def first_client(pending: PendingRequest) -> str:
    """The asking process the provider first saw (fixed at delivery)."""
    return _FIRST_CLIENT.setdefault(pending.request_id, client_of(pending))


def client_of(pending: PendingRequest) -> str:
    """The asking process the provider settles to now (a re-attach changes it)."""
    return pending._members[0].client_id


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
async def test_a_signal_detaches_a_keyed_ask_and_the_card_stays(make_broker, redis_server, namespace, sig):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await asking(redis_server, namespace, *ASK)
        pending = await next_pending(provider)
        first.signal(sig)
        assert await asyncio.wait_for(first.process.wait(), 15) == 75
        await first.expect("detached: the question stays pending")
        async with asyncio.timeout(10):
            while not pending.asker_away:
                await asyncio.sleep(0.05)
        assert not pending.withdrawn.is_set()
        restarted = asyncio.ensure_future(run_qbroker(*ASK, url=redis_server.url, namespace=namespace))
        async with asyncio.timeout(15):
            while pending.asker_away:
                await asyncio.sleep(0.05)
        await pending.answer(pick("yes"))
        status, out, err = await asyncio.wait_for(restarted, 20)
    assert status == 0, err
    assert json.loads(out)["answers"][0]["selected"] == ["yes"]


async def test_the_same_key_with_another_question_is_refused(make_broker, redis_server, namespace):
    holder = await make_broker()
    async with holder.provider("ui") as provider:
        first = await asking(redis_server, namespace, *ASK)
        await next_pending(provider)
        await killed(first)
        other = (*ASK[:-4], "-o", "ship", "-o", "hold")
        status, _, err = await run_qbroker(*other, url=redis_server.url, namespace=namespace)
    assert status == 4, err  # BAD_REQUEST
    assert "different request" in json.loads(err)["message"]
