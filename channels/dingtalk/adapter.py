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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming import StreamingMode
from channels.common.chunks import ChunkProgress, send_chunks, split_text
from channels.common.media import (
    Media,
    MediaTooLarge,
    answer_to,
    download_capped,
    inline_media,
    too_large_text,
)
from channels.common.wechat_api import outbound_text
from channels.dingtalk import signing
from channels.dingtalk.card import DingTalkCardStreamer
from channels.dingtalk.media import unsendable_text, upload, uploads
from channels.dingtalk.openapi import DingTalkApi
from channels.dingtalk.parse import DOWNLOAD_PREFIX, GROUP, SINGLE, parse_message
from channels.dingtalk.settings import DingTalkSettings

log = structlog.get_logger(__name__)

# A session webhook is not used in its last seconds: the send could arrive after it expired.
WEBHOOK_MARGIN_MS = 30_000


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
        self._progress = ChunkProgress(capacity=1000)

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

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """Pictures (and, when the gateway keeps received files, files, voice and video)
        downloaded (download code → temporary URL → bytes); None when one is too large
        (after a polite reply). Voice is not transcribed: DingTalk's `recognition` is."""
        api, limit = self.api, self.settings.media_max_bytes
        if api is None:
            return event

        async def fetch(part: ImagePart | FilePart) -> Media | None:
            if not (part.url or "").startswith(DOWNLOAD_PREFIX):
                return None
            assert part.url is not None
            code = part.url[len(DOWNLOAD_PREFIX) :]
            url = await api.download_url(robot_code=self._robot_code(event.metadata), download_code=code)
            return await download_capped(self.context.http, url, limit)

        try:
            return await inline_media(
                event, fetch, transcribe=None, channel=self.name, files=self.context.keeps_files
            )
        except MediaTooLarge:
            try:
                await self._post(answer_to(event, ""), too_large_text(self.settings.locale, limit))
            except DeliveryError as exc:  # best-effort: nothing is stored either way
                log.warning("dingtalk_too_large_reply_failed", error=exc.detail)
            return None

    def _robot_code(self, metadata: dict[str, Any]) -> str:
        robot_code = str(metadata.get("reply_robot_code") or self.settings.robot_code or "")
        return robot_code or str(self.settings.client_id)

    # --- outbound -------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        if self.api is None:
            raise ChannelSendAuthError("DINGTALK_CLIENT_ID/CLIENT_SECRET are not set", retryable=False)
        chunks = self.chunks(message)
        media = uploads(message)
        if not chunks and not media:
            return SendResult()

        async def deliver(index: int, _item: str) -> str | None:
            return await self.deliver_step(message, index, chunks, media)

        items = [*chunks, *(f"file:{i}" for i in range(len(media)))]
        posted = await send_chunks(self._progress, message.message_id, items, deliver)
        return SendResult(platform_message_id=next((key for key in posted if key), None))

    def chunks(self, message: OutboundMessage) -> list[str]:
        return split_text(outbound_text(message.parts), self.settings.max_message_chars)

    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str | None:
        """One step of a reply: text chunk `index`, or (after the text) one upload and its message."""
        if index < len(chunks):
            return await self._post(message, chunks[index])
        assert self.api is not None
        part = media[index - len(chunks)]
        if message.metadata.get("reply_webhook_only"):
            # Only the session webhook reaches this sender, and it carries no media.
            return await self._post(message, unsendable_text(part, self.settings.locale))
        key, param = await upload(self.api, self.settings.oapi_base, part)
        return await self.api.send_robot(
            robot_code=self._robot_code(message.metadata),
            chat_id=message.chat_id,
            group=_is_group(message),
            msg_key=key,
            param=param,
        )

    async def _post(self, message: OutboundMessage, text: str) -> str | None:
        assert self.api is not None
        webhook = self._valid_webhook(message.metadata)
        if webhook is not None:
            try:
                await self.api.send_by_webhook(webhook, text)
                return None
            except DeliveryError as exc:
                if message.metadata.get("reply_webhook_only"):
                    raise
                log.warning("dingtalk_session_webhook_failed", detail=exc.detail)
                # The robot API reaches the same chat; it decides whether to retry.
        elif message.metadata.get("reply_webhook_only"):
            raise ChannelRejected(
                "no valid session webhook (expired or disabled); the robot API cannot reach this sender"
            )
        return await self.api.send_text(
            robot_code=self._robot_code(message.metadata),
            chat_id=message.chat_id,
            group=_is_group(message),
            text=text,
        )

    def _valid_webhook(self, metadata: dict[str, Any]) -> str | None:
        if not self.settings.use_session_webhook:
            return None
        url = metadata.get("reply_session_webhook")
        expires = metadata.get("reply_session_webhook_expires_ms")
        if not isinstance(url, str) or not isinstance(expires, int):
            return None
        if time.time() * 1000 + WEBHOOK_MARGIN_MS >= expires:
            return None
        return url

    # --- streaming (`app.streaming`) ------------------------------------------------------

    def streamer(self) -> DingTalkCardStreamer | None:
        if self.api is None or self.settings.streaming is not StreamingMode.NATIVE:
            return None
        return DingTalkCardStreamer(self)


def _is_group(message: OutboundMessage) -> bool:
    kind = message.metadata.get("reply_conversation_type")
    if kind in (GROUP, SINGLE):
        return bool(kind == GROUP)
    # No event to ask (a cron job, an operator's send): group conversation ids start with "cid".
    return message.chat_id.startswith("cid")
