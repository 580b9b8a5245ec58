"""Core behaviour the workers once had to work around; kept as regression tests."""

from __future__ import annotations

import pytest

from broker import UserQuestionError


async def test_an_error_raised_inside_broker_agent_is_not_wrapped(make_broker):
    broker = await make_broker()
    with pytest.raises(UserQuestionError):
        async with broker.agent("a"):
            raise UserQuestionError("from the body", "ASK_CANCELLED")


async def test_an_error_raised_inside_broker_provider_is_not_wrapped(make_broker):
    broker = await make_broker()
    with pytest.raises(UserQuestionError):
        async with broker.provider("p"):
            raise UserQuestionError("from the body", "LEASE_LOST")


def test_plan_review_intent_has_its_kind():
    from broker import PlanReviewIntent

    assert PlanReviewIntent(approve="x").kind == "plan-review"
