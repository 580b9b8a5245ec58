"""A fake Slack: the Web API methods the Slack face calls, and interactive payloads signed like Slack's.

``FakeSlack`` serves ``chat.postMessage``, ``chat.update``, ``chat.postEphemeral``, ``views.open`` and
``users.info`` on a free port, answering as Slack does (``{"ok": true, ...}``, ``invalid_auth`` for a wrong
token) and recording every call. ``click`` / ``submit`` build ``block_actions`` and ``view_submission``
payloads from what was posted, form-encode them as ``payload=<json>`` and sign them with the app's
signing secret (``v0=`` HMAC-SHA256 of ``v0:<timestamp>:<body>``), as Slack does before POSTing them
to the app's request URL.

For Socket Mode, ``apps.connections.open`` (called with the app-level token) answers with the URL of
``/link``, a WebSocket that speaks Slack's envelope: ``hello`` on connecting, then each ``envelope``
sent (``{"envelope_id", "type": "interactive", "payload", ...}``), and records the acks the app sends
back (``{"envelope_id", "payload"?}``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.redis_server import free_port

BOT_TOKEN = "xoxb-test-0000-fake"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
APP_TOKEN = "xapp-1-A0001-test-fake"


@dataclass
class FakeSlack:
    emails: dict[str, str] = field(default_factory=dict)
    """Slack member id -> email, for users.info"""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    _ts: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    links: list[asyncio.Queue[dict[str, Any]]] = field(default_factory=list)
    """the Socket Mode connections open now: what to send down each"""
    connected: int = 0
    """how many Socket Mode connections were ever opened"""
    acks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """envelope id -> the ack the app sent for it"""
    _envelopes: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    rate_limited: dict[str, int] = field(default_factory=dict)
    """method -> how many of its next calls are answered 429 with ``Retry-After`` (recorded as ``method:429``)"""
    retry_after_s: int = 2

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def made(self, method: str) -> list[dict[str, Any]]:
        return [args for name, args in self.calls if name == method]

    async def wait_for(self, method: str, count: int = 1, *, where: Any = None) -> list[dict[str, Any]]:
        """The calls of ``method`` (matching ``where``) once there are ``count`` of them."""
        async with asyncio.timeout(10):
            while True:
                found = [args for args in self.made(method) if where is None or where(args)]
                if len(found) >= count:
                    return found
                await asyncio.sleep(0.02)

    async def envelope(self, payload: dict[str, Any], *, kind: str = "interactive") -> str:
        """Send ``payload`` down the one open Socket Mode connection, as Slack does; its envelope id."""
        async with asyncio.timeout(10):
            while len(self.links) != 1:
                await asyncio.sleep(0.02)
        envelope_id = f"e{next(self._envelopes):04d}-fake"
        await self.links[0].put(
            {
                "envelope_id": envelope_id,
                "type": kind,
                "payload": payload,
                "accepts_response_payload": payload.get("type") == "view_submission",
                "retry_attempt": 0,
                "retry_reason": "",
            }
        )
        return envelope_id

    async def ack_of(self, envelope_id: str) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while envelope_id not in self.acks:
                await asyncio.sleep(0.02)
        return self.acks[envelope_id]

    async def _link(self, socket: WebSocket) -> None:
        await socket.accept()
        outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.links.append(outbox)
        self.connected += 1
        await socket.send_json(
            {"type": "hello", "num_connections": len(self.links), "connection_info": {"app_id": "A0001"}}
        )

        async def sending() -> None:
            while True:
                await socket.send_json(await outbox.get())

        sender = asyncio.create_task(sending())
        try:
            while True:
                ack = json.loads(await socket.receive_text())
                self.acks[ack["envelope_id"]] = ack
        except WebSocketDisconnect:
            pass
        finally:
            sender.cancel()
            self.links.remove(outbox)

    async def _method(self, request: Request) -> JSONResponse:
        method = request.path_params["method"]
        if method == "apps.connections.open":  # the only method called with the app-level token
            if request.headers.get("authorization") != f"Bearer {APP_TOKEN}":
                return JSONResponse({"ok": False, "error": "invalid_auth"})
            self.calls.append((method, {}))
            return JSONResponse({"ok": True, "url": f"ws://127.0.0.1:{self.port}/link"})
        if request.headers.get("authorization") != f"Bearer {BOT_TOKEN}":
            return JSONResponse({"ok": False, "error": "invalid_auth"})
        args: dict[str, Any] = dict(request.query_params)
        body = await request.body()
        if "json" in request.headers.get("content-type", ""):
            args.update(json.loads(body))
        elif body:
            args.update((await request.form()).items())
        for name in ("blocks", "view"):  # form-encoded calls carry these as JSON strings
            if isinstance(args.get(name), str):
                args[name] = json.loads(args[name])
        if self.rate_limited.get(method, 0) > 0:  # Slack's rate limit: the client is to wait Retry-After seconds
            self.rate_limited[method] -= 1
            self.calls.append((f"{method}:429", args))
            return JSONResponse(
                {"ok": False, "error": "ratelimited"}, status_code=429, headers={"Retry-After": str(self.retry_after_s)}
            )
        self.calls.append((method, args))
        channel = str(args.get("channel", ""))
        channel_id = channel if channel.startswith("C") else "C" + channel.lstrip("#").upper()
        if method == "chat.postMessage":
            ts = f"1700000000.{next(self._ts):06d}"
            return JSONResponse({"ok": True, "channel": channel_id, "ts": ts, "message": {"text": args.get("text")}})
        if method == "chat.update":
            return JSONResponse({"ok": True, "channel": channel_id, "ts": args.get("ts"), "text": args.get("text")})
        if method == "chat.postEphemeral":
            return JSONResponse({"ok": True, "message_ts": f"1700000001.{next(self._ts):06d}"})
        if method == "views.open":
            return JSONResponse({"ok": True, "view": {**args.get("view", {}), "id": "V0001"}})
        if method == "users.info":
            user = str(args.get("user"))
            if user not in self.emails:
                return JSONResponse({"ok": False, "error": "user_not_found"})
            return JSONResponse({"ok": True, "user": {"id": user, "profile": {"email": self.emails[user]}}})
        return JSONResponse({"ok": False, "error": "unknown_method"})

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[FakeSlack]:
        app = Starlette(
            routes=[Route("/api/{method}", self._method, methods=["GET", "POST"]), WebSocketRoute("/link", self._link)]
        )
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    await asyncio.sleep(0.01)
            yield self
        finally:
            server.should_exit = True
            await task


def signed(
    payload: dict[str, Any], *, secret: str = SIGNING_SECRET, at: float | None = None
) -> tuple[bytes, dict[str, str]]:
    """The POST Slack makes to the request URL: ``payload=<json>``, form-encoded and signed."""
    body = urlencode({"payload": json.dumps(payload)}).encode()
    timestamp = str(int(time.time() if at is None else at))
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": f"v0={digest}",
    }
    return body, headers


def element(message: dict[str, Any], action_id: str) -> tuple[str, dict[str, Any]]:
    """The block id and the element with ``action_id`` in a posted message's blocks."""
    for block in message["blocks"]:
        for candidate in block.get("elements", ()):
            if candidate.get("action_id") == action_id:
                return block["block_id"], candidate
    raise AssertionError(f"no {action_id} in {json.dumps(message['blocks'])[:2000]}")


def block_actions(
    message: dict[str, Any],
    action_id: str,
    *,
    user: str,
    ticked: dict[str, list[int]] | None = None,
    channel: str = "CAPPROVALS",
    ts: str = "",
) -> dict[str, Any]:
    """A click on ``action_id`` of a posted card, as Slack sends it (``state`` holds what is ticked)."""
    block_id, clicked = element(message, action_id)
    values: dict[str, Any] = {}
    for tick_block, indexes in (ticked or {}).items():
        _, box = next(
            (b["block_id"], e) for b in message["blocks"] if b.get("block_id") == tick_block for e in b["elements"]
        )
        chosen = [box["options"][i] for i in indexes]
        state = {"type": box["type"]}
        state.update({"selected_options": chosen} if box["type"] == "checkboxes" else {"selected_option": chosen[0]})
        values[tick_block] = {"qb_sel": state}
    action = {
        "type": clicked["type"],
        "action_id": action_id,
        "block_id": block_id,
        "text": clicked.get("text"),
        "value": clicked.get("value"),
        "action_ts": f"{time.time():.6f}",
    }
    return {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": "T0001"},
        "api_app_id": "A0001",
        "token": "verification-token-unused",
        "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False},
        "trigger_id": f"{time.time():.0f}.1234.{user}",
        "team": {"id": "T0001", "domain": "example"},
        "channel": {"id": channel, "name": "approvals"},
        "message": {"type": "message", "ts": ts, "blocks": message["blocks"]},
        "state": {"values": values},
        "response_url": "https://hooks.slack.com/actions/T0001/1/unused",
        "actions": [action],
    }


def view_submission(view: dict[str, Any], *, user: str, texts: dict[str, str]) -> dict[str, Any]:
    """A modal's submission, as Slack sends it: each input's value under ``state.values``."""
    values = {block: {"text": {"type": "plain_text_input", "value": text}} for block, text in texts.items()}
    return {
        "type": "view_submission",
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": "T0001"},
        "api_app_id": "A0001",
        "trigger_id": f"{time.time():.0f}.5678.{user}",
        "team": {"id": "T0001", "domain": "example"},
        "view": {**view, "id": "V0001", "state": {"values": values}},
    }
