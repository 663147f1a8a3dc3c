"""Slack channel: Events API over HTTP (`POST /channels/slack/events`), Web API for replies.

Inbound requests are verified with Slack's signing rule before anything is parsed, then
committed to the inbox and acknowledged at once (Slack wants an answer within 3 s; the
agent runs later). Replies go through slack_sdk's `AsyncWebClient` (`chat.postMessage`)
pointed at `SLACK_API_BASE_URL`, in the message's thread, split when long.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import aiohttp
import structlog
from slack_sdk.errors import SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.errors import (
    ChannelNotConfigured,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
    InvalidPayload,
)
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage, TextPart
from app.streaming.protocol import Streamer, StreamingMode
from channels.common.after_finish import AfterFinish
from channels.common.media import Media, MediaTooLarge, download_capped, inline_media, too_large_text
from channels.common.steps import held_media
from channels.slack import signing
from channels.slack.native import interaction_payload, needs_thread, parse_block_action, with_thread
from channels.slack.native_outbound import add_approval_buttons, send_native
from channels.slack.native_stream import SlackNativeStreamer
from channels.slack.outbound import SlackOutbound
from channels.slack.parse import Parsed, parse_event_callback
from channels.slack.settings import SlackSettings
from channels.slack.text import split_text

log = structlog.get_logger(__name__)

IDENTITY_RETRY_SECONDS = 30.0


class SlackChannel:
    name = "slack"

    def __init__(self, settings: SlackSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.bot_user_id = settings.bot_user_id
        self._identity_tried_at = -IDENTITY_RETRY_SECONDS
        self.client: AsyncWebClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._socket: Any = None  # Socket Mode client, when SLACK_MODE=socket
        self.outbound: SlackOutbound | None = None  # with the client, at start

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if not self.settings.bot_token:
            log.warning("slack_not_configured", detail="SLACK_BOT_TOKEN is not set")
            return
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout_seconds)
        )
        self.client = AsyncWebClient(
            token=self.settings.bot_token,
            base_url=self.settings.api_base_url,
            timeout=self.settings.request_timeout_seconds,
            session=self._session,
        )
        self.outbound = SlackOutbound(self.client)
        await self._ensure_identity()
        if self.settings.mode == "socket":
            from channels.slack.socket_mode import start_socket_mode

            self._socket = await start_socket_mode(self)

    async def stop(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await self._socket.close()
            self._socket = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _ensure_identity(self) -> None:
        """Learn the bot's user id (to ignore our own messages and find mentions) via auth.test."""
        if self.bot_user_id is not None or self.client is None:
            return
        now = time.monotonic()
        if now - self._identity_tried_at < IDENTITY_RETRY_SECONDS:
            return  # Slack was unreachable a moment ago; do not slow every event down
        self._identity_tried_at = now
        try:
            resp = await self.client.auth_test()
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            log.error("slack_auth_test_failed", error=str(exc))
            return
        user_id = resp.get("user_id")
        self.bot_user_id = str(user_id) if user_id else None

    # --- inbound --------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        path = request.path.strip("/")
        if request.method != "POST" or path not in ("events", "interactions"):
            detail = "POST /channels/slack/events or /channels/slack/interactions"
            return ChannelResponse.json({"error": "not_found", "detail": detail}, 404)
        if not self.settings.signing_secret:
            raise ChannelNotConfigured("SLACK_SIGNING_SECRET is not set on this server")
        signing.verify(
            self.settings.signing_secret,
            request.headers,
            request.body,
            tolerance=self.settings.timestamp_tolerance_seconds,
        )
        if path == "interactions":  # button presses (docs/events.md), signed like events
            await self.handle_interaction(interaction_payload(request.body))
            return ChannelResponse(status=200)
        return ChannelResponse.json(await self.handle_payload(request.json()))

    async def handle_interaction(self, payload: Any) -> None:
        """One verified interaction payload (HTTP or Socket Mode): its button presses accepted."""
        if not isinstance(payload, dict):
            raise InvalidPayload("an interaction payload must be a JSON object")
        if payload.get("type") == "block_actions":
            await self.context.accept(parse_block_action(payload, self.settings.session_scope))

    async def handle_payload(self, payload: Any) -> dict[str, Any]:
        """One verified Events API payload (HTTP or Socket Mode) → the acknowledgement body."""
        if not isinstance(payload, dict):
            raise InvalidPayload("body must be a JSON object")
        kind = payload.get("type")
        if kind == "url_verification":
            challenge = payload.get("challenge")
            if not isinstance(challenge, str):
                raise InvalidPayload("url_verification without a challenge")
            return {"challenge": challenge}
        if kind != "event_callback":
            return {"ok": True, "ignored": f"payload type {kind}"}
        parsed = await self._parse(payload)
        if parsed.event is None:
            return {"ok": True, "ignored": parsed.ignored}
        accepted = parsed.event
        if self.outbound is not None and needs_thread(accepted):  # a reaction's thread
            accepted = await with_thread(self.outbound, accepted)
        event = await self._with_media(accepted)
        if event is None:
            return {"ok": True, "ignored": "media too large"}
        [result] = await self.context.accept([event])
        body: dict[str, Any] = {"ok": True, "event_id": result.event_id, "session_key": result.session_key}
        if result.duplicate:
            body["duplicate"] = True
        if result.skipped:
            body["skipped"] = True
        return body

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """The event with its shared images downloaded (url_private, bot token) as data,
        and its other files too when the gateway keeps received files
        (`ChannelContext.keeps_files`), through the shared `channels.common.media`.

        Over `SLACK_MEDIA_MAX_BYTES`: a polite reply, and the event is not stored (None).
        A failed download keeps the link, which the model is told about in text.
        """
        if not self.settings.bot_token:
            return event
        try:
            return await inline_media(
                event,
                self._fetch,
                transcribe=self.context.transcribe,
                channel="slack",
                files=self.context.keeps_files,
            )
        except MediaTooLarge as exc:
            await self._too_large(event, exc.limit)
            return None

    async def _fetch(self, part: ImagePart | FilePart) -> Media | None:
        """A private file, with the bot token, only under `SLACK_FILES_BASE_URL`."""
        url, token = part.url or "", self.settings.bot_token
        if not token or not url.startswith(self.settings.files_base_url):
            return None  # the token goes nowhere else
        headers = {"Authorization": f"Bearer {token}"}
        trusted = [self.settings.files_base_url]
        return await download_capped(
            self.context.fetcher, url, self.settings.media_max_bytes, headers=headers, trusted=trusted
        )

    async def _too_large(self, event: InboundEvent, limit: int) -> None:
        try:
            assert self.outbound is not None  # events arrive only once started
            await self.outbound.post(
                event.chat_id, too_large_text(self.settings.locale, limit), event.thread_id
            )
        except DeliveryError as exc:  # best-effort: Slack already has our acknowledgement
            log.warning("slack_too_large_reply_failed", error=exc.detail)

    async def _parse(self, payload: dict[str, Any]) -> Parsed:
        if self.bot_user_id is None:
            await self._ensure_identity()  # auth.test failed at start; try again
        return parse_event_callback(payload, self.settings, self.bot_user_id)

    # --- roles ----------------------------------------------------------------------

    async def sender_role(self, chat_id: str, sender_id: str) -> str | None:
        """The sender's role from the workspace (`users.info`; `app.access.roles` caches
        it): owners, admins, and guest accounts (restricted, single-channel) as guests."""
        if self.client is None:
            return None
        user = (await self.client.users_info(user=sender_id)).get("user") or {}
        if user.get("is_owner") or user.get("is_primary_owner"):
            return "owner"
        if user.get("is_admin"):
            return "admin"
        if user.get("is_restricted") or user.get("is_ultra_restricted"):
            return "guest"
        return "member"

    # --- outbound -------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        outbound = self.outbound
        if outbound is None:
            raise ChannelSendAuthError("SLACK_BOT_TOKEN is not set", retryable=False)
        native = await send_native(outbound, message, self.settings.locale)  # docs/events.md
        if native is not None:
            return native
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = held_media(message)
        if not chunks and not media:
            return SendResult()

        async def post(index: int, chunk: str) -> str | None:
            if index >= len(chunks):  # the text first, then each file
                await outbound.upload(message.chat_id, media[index - len(chunks)], message.thread_id)
                return None
            return await outbound.post(message.chat_id, chunk, message.thread_id)

        return await outbound.reply(message.message_id, chunks, len(media), post)

    # --- streaming (`app.streaming`) --------------------------------------------------

    def streamer(self) -> Streamer | None:
        if self.outbound is None or self.settings.streaming is StreamingMode.OFF:
            return None
        if self.settings.streaming is StreamingMode.NATIVE:
            return SlackNativeStreamer(self.outbound, self.settings)
        # An approval prompt that ends a preview gets its buttons too (docs/events.md).
        outbound, locale = self.outbound, self.settings.locale

        async def buttons(message: OutboundMessage, result: SendResult) -> None:
            await add_approval_buttons(outbound, message, result, locale)

        return AfterFinish(SlackStreamer(self.outbound, self.settings), buttons)


class SlackStreamer:
    """Previews as `chat.postMessage` + `chat.update` (Web API tier 3: about 50 a minute).

    Slack's Web API has no typing indicator for bots: `typing` does nothing.
    """

    def __init__(self, outbound: SlackOutbound, settings: SlackSettings) -> None:
        self.outbound = outbound
        self.settings = settings
        self.edit_interval = settings.stream_edit_seconds
        self.max_preview_chars = settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        return None

    async def open(self, message: OutboundMessage) -> str:
        ts = await self.outbound.post(message.chat_id, message.text, message.thread_id)
        if ts is None:
            raise ChannelUnavailable("Slack answered chat.postMessage without a ts")
        return ts

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        await self.outbound.edit(message.chat_id, preview_id, message.text)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = split_text(message.text, self.settings.max_message_chars)

        media = held_media(message)

        async def deliver(index: int, chunk: str) -> str | None:
            if index >= len(chunks):
                await self.outbound.upload(message.chat_id, media[index - len(chunks)], message.thread_id)
                return None
            if index > 0:
                return await self.outbound.post(message.chat_id, chunk, message.thread_id)
            try:
                await self.edit(message.model_copy(update={"parts": (TextPart(text=chunk),)}), preview_id)
            except ChannelRejected as exc:
                if "message_not_found" not in exc.detail:
                    raise
                # The preview was deleted: the answer replaces it as a new message.
                return await self.outbound.post(message.chat_id, chunk, message.thread_id)
            return preview_id

        return await self.outbound.reply(message.message_id, chunks, len(media), deliver, shown=preview_id)
