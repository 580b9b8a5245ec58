"""One typed binding per Lua script: its KEYS and ARGV by name, in its header's order, and its reply decoded.

A binding's keyword parameters are the names its script's contract header gives ``KEYS[i]`` and
``ARGV[i]``, those annotated ``Key`` being KEYS, in the header's order; a record parameter
(ask.lua's ``AskKeys``, ...) stands for its fields, and a list of records for the items the
header repeats per entry. tests/test_script_bindings.py holds each binding to its header. Values
go to Redis as given: the caller converts durations to ms and flags to the script's strings. A
binding returns ``Commands.script``'s awaitable, which decodes the reply: no coroutine of its own.

A script's ``{'err', CODE, message}`` reply decodes to a ``Refusal``, whose ``error()`` is the
one place such a reply becomes a ``UserQuestionError``.

Records are msgspec Structs, built in C. ask.lua's 29 items come as three records: a call of more
than 14 keyword arguments is compiled into a dict built and unpacked on every call.

The bindings live by side (asking.py, answering.py, maintenance.py, what they share in reply.py); import
them from here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .answering import (
    Delivering,
    Delivery,
    Lease,
    Settlement,
    approve,
    audit_append,
    deadletter,
    decision_revoke,
    deliver,
    lease_acquire,
    lease_release,
    lease_renew,
    lease_renew_first,
    notice_ack,
    settle,
)
from .asking import (
    AskArgv,
    Asked,
    AskEnqueue,
    AskKeys,
    agent_heartbeat,
    agent_register,
    ask,
    detach,
    durable_release,
    settled_cleanup,
    withdraw,
)
from .maintenance import (
    audit_cursor,
    away_end,
    expire,
    reap,
    standbys_prune,
)
from .reply import (
    Key,
    Refusal,
    Reply,
)

__all__ = [
    "AskArgv",
    "AskEnqueue",
    "AskKeys",
    "Asked",
    "BINDINGS",
    "Delivering",
    "Delivery",
    "Key",
    "Lease",
    "Refusal",
    "Reply",
    "Settlement",
    "agent_heartbeat",
    "agent_register",
    "approve",
    "ask",
    "audit_append",
    "audit_cursor",
    "away_end",
    "deadletter",
    "decision_revoke",
    "deliver",
    "detach",
    "durable_release",
    "expire",
    "lease_acquire",
    "lease_release",
    "lease_renew",
    "lease_renew_first",
    "notice_ack",
    "reap",
    "settle",
    "settled_cleanup",
    "standbys_prune",
    "withdraw",
]

BINDINGS: dict[str, Callable[..., Awaitable[Any] | None]] = {
    "ask": ask,
    "withdraw": withdraw,
    "detach": detach,
    "settled_cleanup": settled_cleanup,
    "durable_release": durable_release,
    "agent_register": agent_register,
    "agent_heartbeat": agent_heartbeat,
    "lease_acquire": lease_acquire,
    "lease_renew": lease_renew,
    "lease_release": lease_release,
    "notice_ack": notice_ack,
    "deliver": deliver,
    "settle": settle,
    "approve": approve,
    "deadletter": deadletter,
    "decision_revoke": decision_revoke,
    "audit_append": audit_append,
    "reap": reap,
    "expire": expire,
    "away_end": away_end,
    "standbys_prune": standbys_prune,
    "audit_cursor": audit_cursor,
}
"""every script's binding, by script name"""
