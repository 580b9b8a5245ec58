"""An answer's audit entry says what was asked (``asked``): History's text, asker and verdict, whoever answered.

A real Redis and a real provider: the entry (and its copy in the human record) carries the agent, each question's
text cut to ``ASKED_CHARS`` and a plan's approve label; never the asker's instance token; and the chain verifies.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import AskUserQuestionItem, AskUserQuestionOption, AskUserQuestionRequest, PlanReviewIntent
from broker.audit import ASKED_CHARS, asked_of, newest
from tests.helpers import answer
from tests.test_audit import check, entries

pytestmark = pytest.mark.timeout(30)

LONG = "Rotate the keys " + "x" * (2 * ASKED_CHARS)


async def test_an_answer_and_a_dismissal_record_what_was_asked_and_never_the_token(
    make_broker: Any, redis: Redis
) -> None:
    asking, answering = await make_broker(), await make_broker()
    keys = asking.keys
    plan = AskUserQuestionItem(
        id="plan",
        question="Ship the migration plan?",
        detail="# Plan\n\nsecret-looking detail stays out",
        options=(AskUserQuestionOption(label="Go ahead"), AskUserQuestionOption(label="Refuse")),
        intent=PlanReviewIntent(approve="Go ahead"),
    )
    other = AskUserQuestionItem(id="q", question=LONG, options=(AskUserQuestionOption(label="yes"),))
    async with asyncio.timeout(20), asking.agent("ops-1") as agent, answering.provider("p1") as provider:
        stream = aiter(provider)
        asked = asyncio.create_task(asking.ask(AskUserQuestionRequest(questions=(plan, other), agent="ops-1")))
        shown = await anext(stream)
        await shown.answer(answer(("plan", ("Go ahead",), None), ("q", ("yes",), None)), by="alice")
        await asked
        dismissed = asyncio.create_task(asking.ask(AskUserQuestionRequest(questions=(other,), agent="ops-1")))
        await (await anext(stream)).cancel(by="bob")
        with pytest.raises(Exception, match="ASK_CANCELLED"):
            await dismissed
        token = agent.token
    audit = [fields for _, fields in await entries(redis, keys.audit)]
    human = [fields for _, fields in await entries(redis, keys.audit_human)]
    settled = [fields for fields in audit if fields["event"] in {"answered", "cancelled"}]
    assert [fields["event"] for fields in settled] == ["answered", "cancelled"]
    cut = LONG[: ASKED_CHARS - 1] + "…"
    assert json.loads(settled[0]["asked"]) == {
        "agent": "ops-1",
        "questions": [
            {"id": "plan", "question": "Ship the migration plan?", "approve": "Go ahead"},
            {"id": "q", "question": cut},
        ],
    }
    assert json.loads(settled[1]["asked"]) == {"agent": "ops-1", "questions": [{"id": "q", "question": cut}]}
    assert [fields["asked"] for fields in human if "asked" in fields] == [fields["asked"] for fields in settled]
    for fields in [*audit, *human]:
        assert not any(token in value or "secret-looking" in value for value in fields.values())
    assert (await check(answering)).status == "intact"
    newest_first = [fields.get("event") for _, fields in await newest(answering.commands, keys, 3)]
    assert newest_first[:2] == ["checkpoint", "cancelled"]


def test_asked_is_the_compact_json_a_history_reads_whatever_the_text_holds() -> None:
    """asked_of's encoder (msgspec, for speed) writes what the stdlib's compact UTF-8 JSON would: no format drift."""
    text = 'Ship it? "yes" \\ / <b> & é 🚀 \u2028 \n\t\x01\x1f\x7f'
    request = AskUserQuestionRequest(
        questions=(AskUserQuestionItem(id="q1", question=text, options=(AskUserQuestionOption(label="y"),)),),
        agent="builder",
    )
    summary = {"questions": [{"id": "q1", "question": text}], "agent": "builder"}
    assert asked_of(request) == json.dumps(summary, ensure_ascii=False, separators=(",", ":"))
