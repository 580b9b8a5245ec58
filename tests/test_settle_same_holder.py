"""Core behaviour the web provider works around (reported, not fixed here: broker/ is not ours).

``settle.lua`` treats a second settlement by the same lease holder as a retry after a lost
reply and answers ``ok`` without comparing what was sent or by whom. Behind one provider
(the web page) two people answering the same request are then both told they won, and
the audit records only the first. The web provider serialises settlements per request
itself; the core should only accept a retry of the *same* outcome by the *same* person.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from broker import UserQuestionError
from tests.helpers import one_question, pick


async def test_second_different_settlement_by_same_holder_is_refused(make_broker: Callable[..., Any]) -> None:
    asker, answerer = await make_broker(), await make_broker()
    async with answerer.provider("web") as provider:
        asked = asyncio.create_task(asker.ask(one_question("yes", "no"), abort=None, timeout=10))
        pending = await anext(provider)
        await pending.answer(pick("yes"), by="alice")
        with pytest.raises(UserQuestionError) as caught:
            await pending.answer(pick("no"), by="bob")
        assert caught.value.code == "NOT_PENDING"
        assert (await asked).answers[0].selected == ("yes",)
