"""The change stream (``GET /api/events``): server-sent events of the namespaces a person may answer in.

One queue takes the events of every provider the person may use (each event names its namespace);
each is routed (a card routed to a group goes to its members only), windowed (``window.py``), and,
unless it is a status or the server's goodbye, sent only while the session still holds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from broker import UserQuestionError
from workers.answering.web.endpoints import auth_of, config_of, services_of
from workers.answering.web.errors import WebError
from workers.answering.web.service import QUEUE_SIZE, Event, WebProvider
from workers.answering.web.window import PageWindow

__all__ = ["events"]

_KEEPALIVE_S = 15.0
_SESSION_CHECK_S = 1.0
"""how long the change stream waits for Redis to confirm the session before each event"""


def _routed(event: Event, services: dict[str, WebProvider], user: str) -> Event | None:
    """The event as ``user`` may see it: cards routed to a group they are not in are left out, those a
    standby lists read-only (the holder's: ``readonly``) as much as its own."""
    service = services.get(event.get("namespace") or (event.get("request") or {}).get("namespace", ""))
    if service is None or event.get("type") in ("status", "keepalive", "stopping"):
        return event
    if event.get("type") in ("snapshot", "addedMany", "readonly"):
        views = [view for view in event["requests"] if service.may_see(view, user)]
        if event["type"] == "addedMany" and not views:
            return None
        routed = {**event, "requests": views}
        if event["type"] == "snapshot":
            routed["readonly"] = [view for view in event["readonly"] if service.may_see(view, user)]
        return routed
    return event if service.may_see(event, user) else None


async def events(request: Request) -> Response:
    auth = auth_of(request)
    identity = await auth.identify(request)
    mine = services_of(request, identity)
    streams: set[asyncio.Queue[Event | None]] = request.app.state.streams

    async def still_signed_in() -> bool:
        # While Redis is away it cannot tell, and nothing new is delivered meanwhile: the stream
        # goes on and carries the outage to the page (ending it would read as "the server is
        # gone"), and the session is checked again with the next event once Redis answers.
        if not all(service.redis_ok for service in mine):
            return True
        try:
            async with asyncio.timeout(_SESSION_CHECK_S):
                now = await auth.identify(request)
        except WebError:
            return False  # signed out, revoked, expired or removed meanwhile: the stream ends
        except (RedisConnectionError, RedisTimeoutError, UserQuestionError, TimeoutError):
            return True
        # A token has no session to end: its stream ends when where it may answer changed, so
        # that the client opens one for the namespaces of now.
        return now.namespaces == identity.namespaces

    async def stream() -> AsyncIterator[str]:
        queue: asyncio.Queue[Event | None] = asyncio.Queue(QUEUE_SIZE * max(1, len(mine)))
        by_namespace = {service.broker.namespace: service for service in mine}
        window = PageWindow(config_of(request).page_window)
        async with AsyncExitStack() as subscriptions:
            for service in mine:  # one queue for all: every event names its namespace
                await subscriptions.enter_async_context(
                    service.subscribe(queue, user=identity.user, window=config_of(request).page_window)
                )
            streams.add(queue)
            subscriptions.callback(streams.discard, queue)
            yield "retry: 1000\n\n"
            while True:
                try:
                    event = await asyncio.wait_for(queue.get(), _KEEPALIVE_S)
                except TimeoutError:
                    event = {"type": "keepalive"}
                if event is None:
                    return
                event = _routed(event, by_namespace, identity.user)
                if event is None:
                    continue
                namespace = event.get("namespace") or (event.get("request") or {}).get("namespace", "")
                if namespace in by_namespace:
                    service = by_namespace[namespace]
                    event = window.pass_on(event, service.visible_count(identity.user), service.seq_of)
                    if event["type"] == "addedMany":  # the views of the cards the window keeps, built now
                        event = {**event, "requests": service.built(event["requests"])}
                # A status event carries no question: it goes out without a session check, so
                # an outage is shown at once, not after the check's own wait for Redis; so does
                # the server's goodbye, which must go out before the server does.
                if event["type"] not in ("status", "stopping") and not await still_signed_in():
                    return
                if event["type"] == "keepalive":
                    yield ": keepalive\n\n"
                else:
                    yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"x-accel-buffering": "no"})
