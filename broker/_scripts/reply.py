"""What every binding shares: ``Key``, a script's refusal and tagged reply, and the decoders of the simplest replies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import msgspec

from ..errors import UserQuestionError

Key = Annotated[str, "KEYS"]
"""a binding's parameter that is one of its script's KEYS (every other one is an ARGV)"""


class Refusal(msgspec.Struct, frozen=True, gc=False):
    """A script's ``{'err', CODE, message}``: the call changed nothing."""

    code: str
    message: str

    def error(self) -> UserQuestionError:
        """The coded error this refusal stands for; a new one each call, so that each raise has its own."""
        return UserQuestionError(self.message, self.code)


class Reply(msgspec.Struct, frozen=True, gc=False):
    """A script's tagged reply, ``{kind, value?, detail?}``, each item after the kind as text."""

    kind: str
    value: str = ""
    detail: str = ""


def refused(reply: Sequence[Any]) -> Refusal:
    return Refusal(str(reply[1]), str(reply[2]))


def tagged(reply: Sequence[Any]) -> Reply:
    """The reply of a script that refuses nothing."""
    if len(reply) == 1:
        return Reply(reply[0])
    return Reply(reply[0], str(reply[1]), str(reply[2]) if len(reply) > 2 else "")


def tagged_or_refused(reply: Sequence[Any]) -> Reply | Refusal:
    return refused(reply) if reply[0] == "err" else tagged(reply)


def is_one(reply: Any) -> bool:
    return bool(reply == 1)


def is_ok(reply: Sequence[Any]) -> bool:
    return bool(reply[0] == "ok")


def ignored(reply: Any) -> None:
    return None
