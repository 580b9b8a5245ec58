"""The states of one ask and the ways between them (docs/architecture.md, "The life of one ask")."""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "AskState"]


class AskState(enum.Enum):
    """Where one ask is in its life; ``Ask.state`` (_ask.py), changed by ``Ask._to`` only (``TRANSITIONS``)."""

    ASKED = "asked"
    """checked and handed over: the waterfall runs, or ask.lua is called (again, with a new request id, after a
    remembered decision that did not verify)"""
    WAITING = "waiting"
    """ask.lua enqueued its own request: the process's inbox brings the outcome"""
    REATTACHED = "re-attached"
    """a keyed ask took over the pending (or settled, uncollected) request its key names, asked by an earlier
    process: it waits on that request's id"""
    DETACHED = "detached"
    """a keyed ask stopped without an abort or a timeout (cancelled, closed, an outage): its request stays
    pending, answerable, for its detach grace, for a later ask with the same key to re-attach"""
    ENDED = "ended"
    """the ask call returned or raised; final (a withdrawal still in flight may finish after it)"""


TRANSITIONS: dict[AskState, frozenset[AskState]] = {
    AskState.ASKED: frozenset(
        {AskState.ASKED, AskState.WAITING, AskState.REATTACHED, AskState.DETACHED, AskState.ENDED}
    ),
    AskState.WAITING: frozenset({AskState.DETACHED, AskState.ENDED}),
    AskState.REATTACHED: frozenset({AskState.DETACHED, AskState.ENDED}),
    # DETACHED to WAITING or REATTACHED: the broker closed while ask.lua ran (end_on_close detached it), its reply
    # came after
    AskState.DETACHED: frozenset({AskState.DETACHED, AskState.WAITING, AskState.REATTACHED, AskState.ENDED}),
    AskState.ENDED: frozenset(),
}
"""the states an ask may go to from each; ASKED to DETACHED: stopped while ask.lua ran (its reply may be lost)"""
