"""DingTalk channel: robot messages over Stream mode (default) or the HTTP callback.

Stream mode (`DINGTALK_MODE=stream`) needs no public URL: the app opens a WebSocket to
DingTalk (`channels.dingtalk.stream`), held by one replica at a time through
`ChannelContext.hold_connection`. The HTTP callback (`POST /channels/dingtalk`) is
verified with DingTalk's `timestamp`/`sign` rule before anything is parsed. Either way a
message is committed to the inbox (deduplicated on `msgId`) before DingTalk is answered.

Replies go through the message's `sessionWebhook` while it is valid, otherwise through
the robot send API with a cached access token (`channels.dingtalk.openapi`).

Pictures (also in rich text) are downloaded before the message is stored: the download
code gives a temporary URL (`messageFiles/download`), read under `DINGTALK_MEDIA_MAX_BYTES`;
a voice message's text is DingTalk's own transcript (`recognition`). A reply's images and
files are uploaded (`media/upload` on the old OpenAPI) and sent as the robot's image/file
messages, one outbox step each (`channels.dingtalk.media`). Robot messages
cannot be edited; `DINGTALK_STREAMING=native` streams into an AI card
(`channels.dingtalk.card`).

With `DINGTALK_APPROVAL_CARD_TEMPLATE_ID` (Stream mode), an approval prompt is a card with
approve / deny buttons and a press comes back as a card callback
(`channels.dingtalk.approval`, docs/events.md); a refused press is told to the presser
alone, in a one-to-one robot message.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.connections import fingerprint
from app.errors import (
    ChannelNotConfigured,
    ChannelRejected,
    ChannelSendAuthError,
    DeliveryError,
    InvalidPayload,
)
from app.events import APPROVAL_KEY, PRIVATE_NOTICE_KEY, FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming.protocol import Streamer, StreamingMode
from channels.common.after_finish import AfterFinish
from channels.common.media import (
    Media,
    MediaTooLarge,
    answer_to,
    download_capped,
    inline_media,
    too_large_text,
)
from channels.dingtalk import signing
from channels.dingtalk.approval import (
    PRESS_KEY,
    approval_label,
    card_params,
    parse_card_callback,
    prompt_track_id,
)
from channels.dingtalk.card import DingTalkCardStreamer, create_card
from channels.dingtalk.events import parse_event
from channels.dingtalk.openapi import DingTalkApi
from channels.dingtalk.outbound import DingTalkOutbound
from channels.dingtalk.parse import DOWNLOAD_PREFIX, GROUP, SINGLE, parse_message
from channels.dingtalk.settings import DingTalkSettings

log = structlog.get_logger(__name__)


class DingTalkChannel:
    name = "dingtalk"

    def __init__(self, settings: DingTalkSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.api: DingTalkApi | None = None
        if settings.client_id and settings.client_secret:
            self.api = DingTalkApi(
                context.http,
                settings.api_base,
                settings.client_id,
                settings.client_secret,
                timeout=settings.request_timeout_seconds,
            )
        self._stream: asyncio.Task[None] | None = None
        # The robot API calls every sender shares: replies here, previews in the card streamer.
        self.outbound = DingTalkOutbound(self.api, settings) if self.api is not None else None

    @property
    def connection_name(self) -> str:
        return f"dingtalk:{fingerprint(self.settings.client_id or '')}"

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.api is None:
            log.warning("dingtalk_not_configured", detail="DINGTALK_CLIENT_ID/CLIENT_SECRET are not set")
            return
        if self.settings.mode == "stream":
            from channels.dingtalk.stream import run_connection

            async def run() -> None:
                await run_connection(self)

            async def hold() -> None:
                await self.context.hold_connection(self.connection_name, run)

            self._stream = asyncio.create_task(hold(), name="dingtalk-stream")

    async def stop(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._stream
            self._stream = None

    # --- inbound --------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path.strip("/"):
            return ChannelResponse.json({"error": "not_found", "detail": "POST /channels/dingtalk"}, 404)
        if not self.settings.client_secret:
            raise ChannelNotConfigured("DINGTALK_CLIENT_SECRET is not set on this server")
        signing.verify(
            self.settings.client_secret,
            request.headers,
            tolerance_seconds=self.settings.timestamp_tolerance_seconds,
        )
        return ChannelResponse.json(await self.accept_payload(request.json()))

    async def accept_payload(self, payload: Any) -> dict[str, Any]:
        """One robot message (HTTP body or Stream `data`) → stored; what to answer DingTalk."""
        if not isinstance(payload, dict):
            raise InvalidPayload("a robot message must be a JSON object")
        parsed = parse_message(payload, self.settings)
        if parsed.event is None:
            return {"ok": True, "ignored": parsed.ignored}
        event = await self._with_media(parsed.event)
        if event is None:
            return {"ok": True, "ignored": "media too large"}
        [result] = await self.context.accept([event])
        body: dict[str, Any] = {"ok": True, "event_id": result.event_id, "session_key": result.session_key}
        if result.duplicate:
            body["duplicate"] = True
        if result.skipped:
            body["skipped"] = True
        return body

    async def accept_card_callback(self, payload: Any) -> dict[str, Any]:
        """A card callback (Stream `data`): a press on an approval card → stored."""
        parsed = parse_card_callback(payload, self.settings)
        if parsed.event is None:
            return {"ok": True, "ignored": parsed.ignored}
        [result] = await self.context.accept([parsed.event])
        return {"ok": True, "event_id": result.event_id, "duplicate": result.duplicate}

    async def accept_event(self, event_type: str | None, event_id: str | None, data: Any) -> dict[str, Any]:
        """An event of DingTalk's event subscription (Stream EVENT frame): a group's members
        joining or leaving → stored (`channels.dingtalk.events`); any other is ignored."""
        events = parse_event(event_type, event_id, data, self.settings)
        if not events:
            return {"ok": True, "ignored": f"event type {event_type}"}
        results = await self.context.accept(events)
        return {"ok": True, "event_ids": [r.event_id for r in results]}

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """Pictures (and, when the gateway keeps received files, files, voice and video)
        downloaded (download code → temporary URL → bytes); None when one is too large
        (after a polite reply). Voice is not transcribed: DingTalk's `recognition` is."""
        api, outbound, limit = self.api, self.outbound, self.settings.media_max_bytes
        if api is None or outbound is None:
            return event

        async def fetch(part: ImagePart | FilePart) -> Media | None:
            if not (part.url or "").startswith(DOWNLOAD_PREFIX):
                return None
            assert part.url is not None
            code = part.url[len(DOWNLOAD_PREFIX) :]
            url = await api.download_url(robot_code=outbound.robot_code(event.metadata), download_code=code)
            # The URL is DingTalk's answer (its file host, public), judged like any other;
            # only a file on the configured API's own origin (a proxy, a test double) is trusted.
            return await download_capped(self.context.fetcher, url, limit, trusted=[api.base])

        try:
            return await inline_media(
                event, fetch, transcribe=None, channel=self.name, files=self.context.keeps_files
            )
        except MediaTooLarge:
            try:
                assert self.outbound is not None  # events arrive only with credentials
                await self.outbound.post(answer_to(event, ""), too_large_text(self.settings.locale, limit))
            except DeliveryError as exc:  # best-effort: nothing is stored either way
                log.warning("dingtalk_too_large_reply_failed", error=exc.detail)
            return None

    async def send(self, message: OutboundMessage) -> SendResult:
        if self.outbound is None:
            raise ChannelSendAuthError("DINGTALK_CLIENT_ID/CLIENT_SECRET are not set", retryable=False)
        meta = message.metadata
        if meta.get(PRIVATE_NOTICE_KEY) and isinstance(meta.get(PRESS_KEY), str):
            # A refused card press: to the member who pressed alone, one to one.
            await self.outbound.api.send_text(
                robot_code=self.outbound.robot_code(meta),
                chat_id=meta[PRESS_KEY],
                group=False,
                text=message.text,
            )
            return SendResult()
        if APPROVAL_KEY in meta and message.text and self._approval_cards(message):
            return await self._approval_card(message)
        return await self.outbound.send(message)

    # --- approval cards (`channels.dingtalk.approval`) ------------------------------------

    def _approval_cards(self, message: OutboundMessage) -> bool:
        """Cards with buttons need a template, Stream mode (their presses come over it) and
        a sender in the organisation (DingTalk delivers no card to anyone else)."""
        s = self.settings
        return (
            bool(s.approval_card_template_id)
            and s.mode == "stream"
            and not message.metadata.get("reply_webhook_only")
        )

    async def _post_card(self, message: OutboundMessage, text: str) -> str:
        assert self.outbound is not None and self.settings.approval_card_template_id
        kind = message.metadata.get("reply_conversation_type")
        conversation = (
            str(kind) if kind in (SINGLE, GROUP) else (GROUP if message.chat_id.startswith("cid") else SINGLE)
        )
        track_id = prompt_track_id(message, conversation)
        await create_card(
            self.outbound,
            message,
            template=self.settings.approval_card_template_id,
            track_id=track_id,
            params=card_params(message, text),
        )
        return track_id

    async def _approval_card(self, message: OutboundMessage) -> SendResult:
        """The prompt as a card with approve / deny buttons; a prompt longer than one message
        is sent as text, followed by a short card ("Approval #N") with the buttons. A card
        DingTalk refuses leaves the prompt as text (the typed command works)."""
        outbound = self.outbound
        assert outbound is not None
        chunks = outbound.chunks(message)
        items = [*chunks, "card"] if len(chunks) > 1 else ["card"]

        async def deliver(index: int, _item: str) -> str | None:
            if index < len(items) - 1:
                return await outbound.deliver_step(message, index, chunks, [])
            if len(items) == 1:
                try:
                    return await self._post_card(message, message.text)
                except ChannelRejected as exc:
                    log.warning("dingtalk_approval_card_refused", error=exc.detail)
                    return await outbound.post(message, message.text)
            return await self._buttons(message)

        sent = await outbound.steps(message.message_id, items, deliver)
        return SendResult(platform_message_id=next((m for m in sent if m), None))

    async def _buttons(self, message: OutboundMessage) -> str | None:
        """A short card with the buttons, after a prompt sent as text (best-effort)."""
        label = approval_label(message.metadata[APPROVAL_KEY], self.settings.locale)
        try:
            return await self._post_card(message, label)
        except ChannelRejected as exc:  # the prompt is there; the typed command still works
            log.warning("dingtalk_approval_buttons_failed", error=exc.detail)
            return None

    async def _buttons_after_preview(self, message: OutboundMessage, _result: SendResult) -> None:
        """An approval prompt that ends a streamed AI card is followed by the buttons' card."""
        if APPROVAL_KEY in message.metadata and message.text and self._approval_cards(message):
            await self._buttons(message)

    # --- streaming (`app.streaming`) ------------------------------------------------------

    def streamer(self) -> Streamer | None:
        if self.outbound is None or self.settings.streaming is not StreamingMode.NATIVE:
            return None
        cards = DingTalkCardStreamer(self.outbound, self.settings)
        if self.settings.approval_card_template_id and self.settings.mode == "stream":
            return AfterFinish(cards, self._buttons_after_preview)
        return cards
