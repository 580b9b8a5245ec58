"""Slack as a face of the web provider (docs/slack.md): post the cards, take the clicks.

``SlackFace.run()`` follows the web providers' change events like a page does: a card added
is posted (``chat.postMessage``), a vote updates it, a card that goes (answered here or on
the page, dismissed, withdrawn, timed out, expired) is updated in place (``chat.update``).
Only the lease holder has cards to add, so only it posts; the message of each card is kept in
``qb:{NS}:slack:msg:<rid>``, so a server that takes the lease over updates the same message
rather than posting it again.

``SlackFace.interact()`` takes Slack's interactive requests: it checks the signature and
refuses replays (``verify.py``) before reading anything, maps the Slack user to a broker user
(refusing, with an ephemeral message, whoever is not mapped), and answers through the same
``WebProvider.answer`` / ``cancel`` as the page: one settlement at a time per card, a quorum
policy counting a click as that person's vote, a late click told who was first.

``SlackFace.socket_mode()`` (``socket_mode = true``) takes the same payloads over a Socket Mode
connection instead: each ``interactive`` envelope goes to ``handle()`` and is acked with its
envelope id (and a modal's errors, as the HTTP response would carry them). Envelopes are not
signed: the connection itself is authenticated by the app-level token. Only while this server
holds a lease does it connect: Slack hands each envelope to one of the app's open connections, so
a standby's connection would only take clicks away from the holder.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from broker import AskUserQuestionAnswer, AskUserQuestionAnswerItem, PendingRequest, Reads, Tally, UserQuestionError
from workers.answering.slack.blocks import card_blocks, decline_modal, escape, other_modal, plan_chunks, settled_blocks
from workers.answering.slack.clicks import answer_of, ticked
from workers.answering.slack.config import SlackConfig
from workers.answering.slack.messages import MESSAGE_TTL_MS, SlackMessages
from workers.answering.slack.verify import SlackRefused, SlackVerifier
from workers.answering.web.render import plan_review
from workers.answering.web.service import QUEUE_SIZE, AlreadySettled, Event, WebProvider

__all__ = ["MESSAGE_TTL_MS", "SlackFace"]

log = logging.getLogger(__name__)

_SLACK_DOWN = (SlackApiError, aiohttp.ClientError, TimeoutError)
_WITHDRAWN = {
    "timed_out": ":hourglass: *Timed out*: the asker stopped waiting",
    "aborted": ":leftwards_arrow_with_hook: *Withdrawn*: the asker gave up",
    "expired": ":hourglass: *Expired*: nobody answered in time",
}
_HOLDING_EVERY_S = 0.5
"""how often Socket Mode checks whether this server still holds a lease (connects or lets go)"""
_BEFORE_THE_ACK_S = 2.0
"""the most a Web API call made before acking a click may take: Slack shows the clicker an error past 3 s"""
_TELLS_QUEUED = 1000
"""ephemeral replies waiting for the Web API (a rate limit); past this the oldest is dropped, logged"""
Response = tuple[int, dict[str, Any] | None]


class SlackFace:
    """The Slack face of this server's web providers (one per namespace served)."""

    def __init__(self, config: SlackConfig, services: Mapping[str, WebProvider], *, public_url: str = "") -> None:
        self.config = config
        self.services = dict(services)
        self.public_url = public_url
        self.client = AsyncWebClient(token=config.bot_token, base_url=config.api_url, timeout=10)
        self.client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=2))
        primary = next(iter(self.services.values()))
        # Without a signing secret (Socket Mode only) the request URL takes nothing: an empty secret
        # would let anyone sign.
        self.verifier = (
            SlackVerifier(config.signing_secret, primary.broker.commands.call, primary.keys)
            if config.signing_secret
            else None
        )
        self._messages = {
            namespace: SlackMessages(service.broker.commands.call, service.keys)
            for namespace, service in self.services.items()
        }
        self._cards: dict[str, dict[str, Any]] = {}
        """request id -> {channel, ts, blocks}: the messages of the cards shown"""
        self._via_slack: dict[str, str] = {}
        """request id -> who is settling it from Slack right now (the card then says "in Slack")"""
        self._emails: dict[str, str | None] = {}
        self._tells: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue(_TELLS_QUEUED)
        """(channel, Slack user, text) to post after the click's ack: acking never waits on the Web API"""

    def __repr__(self) -> str:
        return f"SlackFace(channel={self.config.channel!r}, namespaces={list(self.services)!r})"  # no secrets

    # -- posting --------------------------------------------------------------------

    async def run(self) -> None:
        """Follow every provider's changes and keep the Slack messages in step, and tell clickers, until cancelled."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._telling(), name="qb-slack-tell")
            await self._following()

    async def _following(self) -> None:
        while True:
            queue: asyncio.Queue[Event | None] = asyncio.Queue(QUEUE_SIZE * len(self.services))
            async with AsyncExitStack() as subscriptions:
                for service in self.services.values():
                    await subscriptions.enter_async_context(service.subscribe(queue))
                while (event := await queue.get()) is not None:
                    try:
                        await self._follow(event)
                    except _SLACK_DOWN as error:
                        log.warning("Slack did not take %s of %s: %s", event.get("type"), event.get("id"), error)
            await asyncio.sleep(0.5)  # dropped for stalling (or the server stops): subscribe again

    async def _follow(self, event: Event) -> None:
        kind = event["type"]
        if kind == "snapshot":
            for view in event["requests"]:
                await self._show(view)
        elif kind == "added":
            await self._show(event["request"])
        elif kind == "addedMany" and (service := self.services.get(event["namespace"])) is not None:
            for view in service.built(event["requests"]):
                await self._show(view)
        elif kind == "updated" and "quorum" in event:
            card = self._cards.get(event["id"])
            service = self.services.get(event.get("namespace", ""))
            pending = service.pending_request(event["id"]) if service else None
            if card is not None and pending is not None and service is not None:
                view = {**(service.view_of(event["id"]) or {}), **event}
                card["blocks"] = card_blocks(pending, view, service.broker.namespace, self.public_url)
                await self.client.chat_update(
                    channel=card["channel"], ts=card["ts"], blocks=card["blocks"], text=_fallback(pending)
                )
        elif kind == "removed" and event.get("reason") != "lost":
            await self._settled(event)

    async def _show(self, view: dict[str, Any]) -> None:
        namespace, request_id = view.get("namespace", ""), view["id"]
        service = self.services.get(namespace)
        pending = service.pending_request(request_id) if service else None
        if service is None or pending is None:
            return
        blocks = card_blocks(pending, view, namespace, self.public_url)
        mention = self._mention(service, view.get("routes") or ([view["route"]] if view.get("route") else []))
        if mention:
            blocks.insert(0, {"type": "section", "text": {"type": "mrkdwn", "text": mention}})
        messages = self._messages[namespace]
        known = await messages.find(request_id)
        if known is not None:  # posted before a failover (or a restart): the same message, brought up to date
            channel, ts = known
            await self.client.chat_update(channel=channel, ts=ts, blocks=blocks, text=_fallback(pending))
        else:
            channel = self.config.channel_for(namespace, pending.priority, pending.agent_id)
            posted = await self.client.chat_postMessage(channel=channel, blocks=blocks, text=_fallback(pending))
            channel, ts = str(posted["channel"]), str(posted["ts"])
            await messages.keep(request_id, channel, ts)
            for chunk in plan_chunks(pending):  # a long plan, whole, in the card's thread
                await self.client.chat_postMessage(channel=channel, thread_ts=ts, text=chunk, mrkdwn=True)
        self._cards[request_id] = {"channel": channel, "ts": ts, "blocks": blocks}

    def _mention(self, service: WebProvider, routes: list[str]) -> str:
        """A routed card says who may answer it and mentions those with a Slack id (the escalation
        group too, once the card escalated): a click from anyone else is refused."""
        if not routes:
            return ""
        groups = service.policies.groups
        members = sorted({person for group in routes for person in groups.get(group, frozenset())})
        ids = [slack for slack in map(self.config.slack_id_of, members) if slack]
        who = f"Only {escape(' or '.join(routes))} may answer: {escape(', '.join(members) or 'nobody')}"
        return who + ("\n" + " ".join(f"<@{slack}>" for slack in ids) if ids else "")

    async def _settled(self, event: Event) -> None:
        request_id = event["id"]
        service = self.services.get(event.get("namespace", ""))
        if service is None:
            return
        card = self._cards.pop(request_id, None)
        if card is None:
            known = await self._messages[service.broker.namespace].find(request_id)
            if known is None:
                return
            card = {"channel": known[0], "ts": known[1], "blocks": []}
        outcome = await self._outcome(service, event)
        blocks = settled_blocks(card["blocks"], outcome)
        await self.client.chat_update(channel=card["channel"], ts=card["ts"], blocks=blocks, text=outcome)

    async def _outcome(self, service: WebProvider, event: Event) -> str:
        reason, by = event.get("reason"), escape(event.get("by") or "")
        where = "in Slack" if self._via_slack.pop(event["id"], None) is not None else "on the web"
        settled = event.get("settled") or {}
        if reason == "answered":
            return f":white_check_mark: *Answered by {by} {where}*: {_summary(settled.get('answer'))}"
        if reason == "cancelled":
            return f":no_entry_sign: *Dismissed by {by} {where}*"
        if reason == "withdrawn":
            state = await self._why_withdrawn(service, event["id"])
            return _WITHDRAWN.get(state, ":leftwards_arrow_with_hook: *Withdrawn* by the asker")
        return f":information_source: *{escape(str(reason))}*" + (f" by {by}" if by else "")

    @staticmethod
    async def _why_withdrawn(service: WebProvider, request_id: str) -> str:
        """Timed out, aborted or expired: the askers' log says (the request hash is gone with it)."""
        try:
            entries = await Reads(service.broker).newest_asker_log(200)
        except Exception as error:  # only the wording of the card depends on it: never fail the update
            log.debug("cannot read why %s was withdrawn: %s", request_id, error)
            return ""
        for _, fields in entries:
            if fields.get("rid") == request_id:
                return str(fields.get("event", ""))
        return ""

    # -- answering ------------------------------------------------------------------

    async def interact(self, body: bytes, headers: Mapping[str, str]) -> Response:
        """One interactive request: ``(HTTP status, JSON body or None)`` to answer Slack with."""
        try:
            if self.verifier is None:
                raise SlackRefused("no signing secret: this server takes Slack's clicks over Socket Mode only")
            await self.verifier.check(body, headers)
        except SlackRefused as refused:
            log.warning("refused a Slack request: %s", refused.reason)
            return 401, {"error": refused.reason}
        try:
            payload = json.loads(parse_qs(body.decode())["payload"][0])
        except (KeyError, IndexError, ValueError, TypeError):
            return 400, {"error": "not an interactive payload"}
        return await self.handle(payload)

    async def handle(self, payload: Any) -> Response:
        """An interactive payload already known to be Slack's (signed, or from the Socket Mode connection)."""
        try:
            kind, slack_user = payload["type"], payload["user"]["id"]
        except (KeyError, IndexError, ValueError, TypeError):
            return 400, {"error": "not an interactive payload"}
        if kind == "block_actions":
            return await self._action(payload, slack_user)
        if kind == "view_submission":
            return await self._submission(payload, slack_user)
        return 200, None

    # -- Socket Mode ----------------------------------------------------------------

    def _holding(self) -> bool:
        return any(service.status == "active" for service in self.services.values())

    async def socket_mode(self) -> None:
        """Hold a Socket Mode connection while this server holds a lease, until cancelled."""
        while True:
            await self._until(holding=True)
            # Its own Web API client: apps.connections.open is called with the app-level token.
            web_client = AsyncWebClient(base_url=self.config.api_url, timeout=10)
            client = SocketModeClient(app_token=self.config.app_token, web_client=web_client)
            client.socket_mode_request_listeners.append(self._envelope)
            try:
                await client.connect()  # type: ignore[no-untyped-call]  # retries by itself until Slack answers
                log.info("Slack Socket Mode connected")
                await self._until(holding=False)
                log.info("Slack Socket Mode let go: this server no longer holds a lease")
            finally:
                await asyncio.shield(client.close())  # type: ignore[no-untyped-call]
                await client.aiohttp_client_session.close()

    async def _until(self, *, holding: bool) -> None:
        # Polled: each provider's lease loop sets its status, with no event of its own for this face.
        while True:
            if self._holding() == holding:
                return
            await asyncio.sleep(_HOLDING_EVERY_S)

    async def _envelope(self, client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        """One envelope: an interactive one answered like a request to the request URL; every one acked."""
        reply = None
        if request.type == "interactive":
            try:
                _, reply = await self.handle(request.payload)
            finally:
                # Acked after handling, as the HTTP route answers: a modal's errors ride on the ack.
                await client.send_socket_mode_response(SocketModeResponse(request.envelope_id, reply))
        else:
            await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))

    async def _user(self, slack_user: str) -> str | None:
        user = self.config.user_of(slack_user)
        if user is None and self.config.needs_email:
            if slack_user not in self._emails:
                try:
                    async with asyncio.timeout(_BEFORE_THE_ACK_S):  # the click waits for it
                        info = await self.client.users_info(user=slack_user)
                    self._emails[slack_user] = (info.get("user") or {}).get("profile", {}).get("email")
                except _SLACK_DOWN as error:
                    log.warning("cannot read Slack user %s: %s", slack_user, error)
                    return None
            user = self.config.user_of(slack_user, self._emails[slack_user])
        return user

    def _tell(self, channel: str | None, slack_user: str, text: str) -> None:
        """Queue a reply for the clicker, posted after the ack (a rate-limited post retries for seconds)."""
        if not channel:
            return
        if self._tells.full():
            dropped = self._tells.get_nowait()
            log.warning("too many Slack replies waiting: %s is not told %r", dropped[1], dropped[2])
        self._tells.put_nowait((channel, slack_user, text))

    async def _telling(self) -> None:
        while True:
            channel, slack_user, text = await self._tells.get()
            try:
                await self.client.chat_postEphemeral(channel=channel, user=slack_user, text=text)
            except _SLACK_DOWN as error:
                log.warning("cannot tell %s in Slack: %s", slack_user, error)
            finally:
                self._tells.task_done()

    async def _action(self, payload: dict[str, Any], slack_user: str) -> Response:
        action = (payload.get("actions") or [{}])[0]
        action_id, channel = str(action.get("action_id", "")), (payload.get("channel") or {}).get("id")
        if action_id in ("qb_web", "qb_sel") or not action_id.startswith("qb_"):
            return 200, None  # a link, or a tick in a checkbox: nothing to answer yet
        user = await self._user(slack_user)
        if user is None:
            self._tell(channel, slack_user, "You are not mapped to a question-broker user, so you cannot answer here.")
            return 200, None
        try:
            ref = json.loads(action["value"])
            service, pending = self.services[ref["n"]], ref["r"]
        except (KeyError, ValueError, TypeError):
            return 200, None
        card = service.pending_request(pending)
        if action_id in ("qb_other", "qb_decline"):
            if card is None:  # settled meanwhile: say by whom instead of opening a form
                return await self._answering(service, pending, None, user, slack_user, channel)
            metadata = json.dumps({"n": ref["n"], "r": pending, "c": channel, "s": ticked(payload, card)})
            review = plan_review(card.request.questions[0], len(card.request.questions))
            modal = (
                decline_modal(card, metadata, (review or {}).get("refuse"))
                if action_id == "qb_decline"
                else other_modal(card, metadata)
            )
            try:
                # Before the ack, and a trigger is good for 3 s anyway: a modal Slack is slow to take is given up.
                async with asyncio.timeout(_BEFORE_THE_ACK_S):
                    await self.client.views_open(trigger_id=payload["trigger_id"], view=modal)
            except (*_SLACK_DOWN, KeyError) as error:
                log.warning("cannot open a Slack modal: %s", error)
            return 200, None
        if action_id == "qb_dismiss":
            return await self._answering(
                service, pending, None, user, slack_user, channel, cancel=f"{user} dismissed the question in Slack"
            )
        if action_id == "qb_submit" and card is not None:
            picked = ticked(payload, card)
            unpicked = [item.question for i, item in enumerate(card.request.questions) if not picked[str(i)]]
            if unpicked:  # nothing picked would answer a skip, which nobody chose here
                text = f"Nothing is picked for “{escape(unpicked[0])}”: pick an answer (Other… for your own words)."
                self._tell(channel, slack_user, text + " A question is skipped only on the web page.")
                return 200, None
        answer = answer_of(action_id, ref, payload, card)
        return await self._answering(service, pending, answer, user, slack_user, channel)

    async def _submission(self, payload: dict[str, Any], slack_user: str) -> Response:
        view = payload.get("view") or {}
        try:
            meta = json.loads(view["private_metadata"])
            service, request_id, channel = self.services[meta["n"]], meta["r"], meta.get("c")
        except (KeyError, ValueError, TypeError):
            return 200, None
        user = await self._user(slack_user)
        if user is None:
            return 200, {
                "response_action": "errors",
                "errors": {"qbt_0": "You are not mapped to a question-broker user."},
            }
        card = service.pending_request(request_id)
        if card is None:
            await self._answering(service, request_id, None, user, slack_user, channel)
            return 200, None
        values = (view.get("state") or {}).get("values") or {}
        texts = {
            int(block[4:]): str(((field or {}).get("text") or {}).get("value") or "").strip()
            for block, field in values.items()
            if block.startswith("qbt_") and block[4:].isdigit()
        }
        questions = card.request.questions
        items: list[AskUserQuestionAnswerItem] = []
        if view.get("callback_id") == "qb_decline":
            review = plan_review(questions[0], len(questions)) or {}
            note, refuse = texts.get(0, ""), review.get("refuse")
            if not note and refuse is None:
                return 200, {"response_action": "errors", "errors": {"qbt_0": "Say what should change."}}
            items.append(
                AskUserQuestionAnswerItem(id=questions[0].id, selected=(), custom=note)
                if note
                else AskUserQuestionAnswerItem(id=questions[0].id, selected=(str(refuse),))
            )
        else:
            picked = meta.get("s") or {}
            for index, item in enumerate(questions):
                text = texts.get(index, "")
                chosen = tuple(picked.get(str(index), ()))
                if text and item.multi_select:
                    items.append(AskUserQuestionAnswerItem(id=item.id, selected=chosen, custom=text))
                elif text:
                    items.append(AskUserQuestionAnswerItem(id=item.id, selected=(), custom=text))
                elif chosen:
                    items.append(AskUserQuestionAnswerItem(id=item.id, selected=chosen))
                else:  # nothing picked, nothing written: a skip nobody chose
                    error = "Write an answer, or pick one on the card first."
                    return 200, {"response_action": "errors", "errors": {f"qbt_{index}": error}}
        status, errors = await self._answering(
            service, request_id, AskUserQuestionAnswer(answers=tuple(items)), user, slack_user, channel
        )
        return status, errors

    async def _answering(
        self,
        service: WebProvider,
        request_id: str,
        answer: AskUserQuestionAnswer | None,
        user: str,
        slack_user: str,
        channel: str | None,
        *,
        cancel: str | None = None,
    ) -> Response:
        """Settle (or vote) as ``user``, exactly as the page does; tell them in Slack what came of it."""
        if not cancel and answer is None:
            if service.pending_request(request_id) is not None:
                self._tell(channel, slack_user, "That click does not fit this card: answer it on the web.")
                return 200, None
            # gone meanwhile: who was first, if the clicker (the person, not the Slack id) could see the card
            late = await service.settled_how(request_id, user)
            self._tell(channel, slack_user, _late_text(late))
            return 200, None
        self._via_slack[request_id] = user
        result: AskUserQuestionAnswer | Tally | None = None
        try:
            if cancel:
                result = await service.cancel(request_id, cancel, by=user)
            elif answer is not None:
                result = await service.answer(request_id, answer, by=user)
        except UserQuestionError as error:
            self._via_slack.pop(request_id, None)
            text = _late_text(error) if isinstance(error, AlreadySettled) else f"Not taken: {error}"
            self._tell(channel, slack_user, text)
            return 200, None
        if isinstance(result, Tally) and result.decided is None:
            self._via_slack.pop(request_id, None)
            self._tell(channel, slack_user, "Your vote is recorded; the card waits for more approvals.")
        return 200, None


def _late_text(late: AlreadySettled) -> str:
    """A late click's ephemeral answer: who was first (when known)."""
    winner = late.winner or {}
    state = winner.get("state") or "settled"
    by = f" by {winner['by']}" if winner.get("by") else ""
    return f"Already {state}{by}: your click was not taken."


def _fallback(pending: PendingRequest) -> str:
    """The notification's text (and what a screen reader says): the first question."""
    first = pending.request.questions[0]
    return f"{pending.agent_id or 'An agent'} asks: {first.question}"[:300]


def _summary(answer: Any) -> str:
    if not isinstance(answer, dict):
        return ""
    parts = []
    for item in answer.get("answers") or ():
        chosen = [*item.get("selected", ())] + ([f"“{item['custom']}”"] if item.get("custom") else [])
        parts.append(", ".join(chosen) or "(skipped)")
    return escape("; ".join(parts))[:2500]
