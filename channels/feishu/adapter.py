"""Feishu/Lark channel: event subscription callback (`POST /channels/feishu`), Open API replies.

Inbound: Feishu POSTs schema 2.0 events, plain or encrypted (`{"encrypt": …}`) when an
Encrypt Key is set, and then signed (`X-Lark-Signature`). The signature is checked on the
raw body before anything else, the body decrypted, the verification token compared, and
an `im.message.receive_v1` message committed to the inbox and answered 200 at once
(Feishu redelivers events it got no answer for within a few seconds; the agent runs
later). `url_verification` is answered with its `challenge`.

Outbound: `POST /open-apis/im/v1/messages?receive_id_type=chat_id`, or
`/open-apis/im/v1/messages/{message_id}/reply` to answer a group message (in its thread
when it has one), with a tenant access token (`api.FeishuApi`). Long replies are split;
each piece carries a `uuid` made of the outbox message id, so Feishu itself drops a piece
sent twice by a retry. A reply's images and files are uploaded (`im/v1/images`,
`im/v1/files`) and sent as image/file messages, one outbox step each
(`channels.feishu.media`). Streaming (`FEISHU_STREAMING=edit`): a preview message edited in
place (`channels.feishu.stream`); `native`: a streaming card (`channels.feishu.card`).
Inbound images are downloaded from the message's resources with the tenant token, under
`FEISHU_MEDIA_MAX_BYTES`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import structlog

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelRequestError,
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
from channels.feishu import crypto
from channels.feishu.api import FeishuApi
from channels.feishu.card import FeishuCardStreamer
from channels.feishu.media import upload, uploads
from channels.feishu.parse import MESSAGE_RECEIVED, Parsed, parse_message_event
from channels.feishu.settings import FeishuSettings
from channels.feishu.stream import FeishuStreamer

log = structlog.get_logger(__name__)

IDENTITY_RETRY_SECONDS = 30.0
BOT_INFO_PATH = "/open-apis/bot/v3/info"
PARENT_LOOKUP_SECONDS = 1.5


class FeishuChannel:
    name = "feishu"

    def __init__(self, settings: FeishuSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.api = FeishuApi(context.http, settings)
        self.bot_open_id = settings.bot_open_id
        self._identity_tried_at = -IDENTITY_RETRY_SECONDS
        self._progress = ChunkProgress(capacity=1000)

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        if not s.verification_token and not s.encrypt_key:
            log.warning(
                "feishu_not_configured", detail="FEISHU_VERIFICATION_TOKEN or FEISHU_ENCRYPT_KEY is not set"
            )
        await self._ensure_identity()

    async def stop(self) -> None:
        return None

    async def _ensure_identity(self) -> None:
        """Learn the bot's open_id (to find mentions of it) through bot/v3/info."""
        s = self.settings
        if self.bot_open_id is not None or not s.app_id or not s.app_secret:
            return
        now = time.monotonic()
        if now - self._identity_tried_at < IDENTITY_RETRY_SECONDS:
            return  # Feishu was unreachable a moment ago; do not slow every event down
        self._identity_tried_at = now
        try:
            answer = await self.api.get(BOT_INFO_PATH)
        except DeliveryError as exc:
            log.error("feishu_bot_info_failed", error=exc.detail)
            return
        bot = answer.get("bot")
        open_id = bot.get("open_id") if isinstance(bot, dict) else None
        self.bot_open_id = open_id if isinstance(open_id, str) and open_id else None

    # --- inbound ----------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path.strip("/"):
            return ChannelResponse.json({"error": "not_found", "detail": "POST /channels/feishu"}, 404)
        s = self.settings
        if not s.verification_token and not s.encrypt_key:
            raise ChannelNotConfigured(
                "FEISHU_VERIFICATION_TOKEN or FEISHU_ENCRYPT_KEY must be set on this server"
            )
        signed = False
        if s.encrypt_key and crypto.has_signature(request.headers):
            # Checked on the raw body, before it is parsed or decrypted.
            crypto.verify_signature(
                s.encrypt_key, request.headers, request.body, tolerance=s.timestamp_tolerance_seconds
            )
            signed = True
        if s.encrypt_key and not signed:
            return ChannelResponse.json(self._unsigned(request))
        payload = self._open(request.json())
        if payload.get("type") == "url_verification":
            return ChannelResponse.json(self._url_verification(payload))
        header = payload.get("header")
        if payload.get("schema") != "2.0" or not isinstance(header, dict):
            raise InvalidPayload("only event subscription schema 2.0 is supported")
        self._check_token(header.get("token"))
        kind = header.get("event_type")
        if kind != MESSAGE_RECEIVED:
            return ChannelResponse.json({"ok": True, "ignored": f"event type {kind}"})
        parsed = await self._parse(payload)
        if parsed.event is None:
            return ChannelResponse.json({"ok": True, "ignored": parsed.ignored})
        event = await self._with_media(parsed.event)
        if event is None:
            return ChannelResponse.json({"ok": True, "ignored": "media too large"})
        [result] = await self.context.accept([event])
        body: dict[str, Any] = {"ok": True, "event_id": result.event_id, "session_key": result.session_key}
        if result.duplicate:
            body["duplicate"] = True
        if result.skipped:
            body["skipped"] = True
        return ChannelResponse.json(body)

    def _unsigned(self, request: ChannelRequest) -> dict[str, Any]:
        """With an Encrypt Key, Feishu signs every event; only `url_verification` comes unsigned.

        It must be encrypted with our key. Every way to fail gets the same answer, so that
        unsigned requests cannot be used to learn anything about a ciphertext (a padding
        oracle) or about our settings.
        """
        refused = ChannelAuthError(
            "missing X-Lark-Signature headers (only an encrypted url_verification comes unsigned)"
        )
        try:
            body = request.json()
            if not isinstance(body, dict) or not isinstance(body.get("encrypt"), str):
                raise refused
            payload = self._open(body)
            if payload.get("type") != "url_verification":
                raise refused
            return self._url_verification(payload)
        except ChannelRequestError as exc:
            raise refused from exc

    def _open(self, body: Any) -> dict[str, Any]:
        """The event itself: the body, or what its `encrypt` field decrypts to."""
        if not isinstance(body, dict):
            raise InvalidPayload("body must be a JSON object")
        encrypted = body.get("encrypt")
        if encrypted is None:
            return body
        if not self.settings.encrypt_key:
            raise ChannelNotConfigured(
                "the body is encrypted but FEISHU_ENCRYPT_KEY is not set on this server"
            )
        if not isinstance(encrypted, str):
            raise InvalidPayload("encrypt must be a string")
        plain = crypto.decrypt(self.settings.encrypt_key, encrypted)
        try:
            payload = json.loads(plain)
        except (ValueError, UnicodeDecodeError) as exc:
            # Padding that checks out by chance: this was not encrypted with our key either.
            raise ChannelAuthError("encrypt does not decrypt to JSON with FEISHU_ENCRYPT_KEY") from exc
        if not isinstance(payload, dict):
            raise InvalidPayload("decrypted body must be a JSON object")
        return payload

    def _url_verification(self, payload: dict[str, Any]) -> dict[str, Any]:
        self._check_token(payload.get("token"))
        challenge = payload.get("challenge")
        if not isinstance(challenge, str) or not challenge:
            raise InvalidPayload("url_verification without a challenge")
        return {"challenge": challenge}

    def _check_token(self, token: Any) -> None:
        expected = self.settings.verification_token
        if not expected:
            return  # an Encrypt Key alone: the body was signed or encrypted with it
        if not isinstance(token, str) or not crypto.same_secret(expected, token):
            raise ChannelAuthError("the verification token does not match FEISHU_VERIFICATION_TOKEN")

    async def _parse(self, payload: dict[str, Any]) -> Parsed:
        if self.bot_open_id is None:
            await self._ensure_identity()  # bot/v3/info failed at start; try again
        parsed = parse_message_event(payload, self.settings, self.bot_open_id)
        if parsed.unmentioned_reply_to and await self._sent_by_bot(parsed.unmentioned_reply_to):
            parsed = parse_message_event(payload, self.settings, self.bot_open_id, replied_to_bot=True)
        return parsed

    async def _sent_by_bot(self, message_id: str) -> bool:
        """Whether this app sent the message (`GET /open-apis/im/v1/messages/{id}`)."""
        if not self.settings.app_id or not self.settings.app_secret:
            return False
        try:
            # Inside Feishu's ~3 s wait for our answer: a slow lookup counts as "not ours".
            answer = await self.api.get(
                f"/open-apis/im/v1/messages/{message_id}", timeout=PARENT_LOOKUP_SECONDS
            )
        except DeliveryError as exc:
            log.warning("feishu_parent_lookup_failed", message_id=message_id, error=exc.detail)
            return False
        data = answer.get("data")
        items = data.get("items") if isinstance(data, dict) else None
        sender = (
            items[0].get("sender")
            if isinstance(items, list) and items and isinstance(items[0], dict)
            else None
        )
        return (
            isinstance(sender, dict)
            and sender.get("sender_type") == "app"
            and sender.get("id") == self.settings.app_id
        )

    # --- outbound ---------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        chunks = self.chunks(message)
        media = uploads(message)
        if not chunks and not media:
            return SendResult()

        async def deliver(index: int, _item: str) -> str | None:
            return await self.deliver_step(message, index, chunks, media)

        items = [*chunks, *(f"file:{i}" for i in range(len(media)))]
        sent = await send_chunks(self._progress, message.message_id, items, deliver)
        return SendResult(platform_message_id=next((m for m in sent if m), None))

    def chunks(self, message: OutboundMessage) -> list[str]:
        return split_text(outbound_text(message.parts), self.settings.max_message_bytes, units=_sent_bytes)

    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str | None:
        """One step of a reply: text chunk `index`, or (after the text) one upload and its message."""
        if index < len(chunks):
            msg_type, content = "text", json.dumps({"text": chunks[index]}, ensure_ascii=False)
        else:
            msg_type, content = await upload(self.api, media[index - len(chunks)])
        # Feishu sends at most one message per uuid within an hour.
        return await self.post_message(message, msg_type, content, uuid=f"{message.message_id}-{index}")

    async def post_message(
        self, message: OutboundMessage, msg_type: str, content: str, *, uuid: str | None = None
    ) -> str | None:
        """Send one message where the reply goes (a reply to the message, or into the chat)."""
        reply_to, in_thread = _reply_target(message)
        body: dict[str, Any] = {"msg_type": msg_type, "content": content}
        if uuid is not None:
            body["uuid"] = uuid
        if reply_to:
            body["reply_in_thread"] = in_thread
            data = await self.api.post(f"/open-apis/im/v1/messages/{reply_to}/reply", body)
        else:
            body["receive_id"] = message.chat_id
            data = await self.api.post("/open-apis/im/v1/messages", body, {"receive_id_type": "chat_id"})
        sent = data.get("message_id") if isinstance(data, dict) else None
        return str(sent) if sent else None

    # --- inbound media ------------------------------------------------------------------

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """Images (with speech to text, audio; when the gateway keeps received files, every
        file, voice and video) downloaded from the message's resources with the tenant
        token (`?type=file` for all but images); None when one is too large (after a polite
        reply)."""
        limit = self.settings.media_max_bytes
        prefix = self.settings.api_base.rstrip("/") + "/open-apis/im/v1/messages/"

        async def fetch(part: ImagePart | FilePart) -> Media | None:
            if not (part.url or "").startswith(prefix):
                return None
            assert part.url is not None
            token = await self.api.tokens.get()
            headers = {"Authorization": f"Bearer {token}"}
            return await download_capped(self.context.http, part.url, limit, headers=headers)

        try:
            return await inline_media(
                event,
                fetch,
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,
            )
        except MediaTooLarge:
            reply = answer_to(event, "")
            text = json.dumps({"text": too_large_text(self.settings.locale, limit)}, ensure_ascii=False)
            try:
                await self.post_message(reply, "text", text)
            except DeliveryError as exc:  # best-effort: nothing is stored either way
                log.warning("feishu_too_large_reply_failed", error=exc.detail)
            return None

    # --- streaming (`app.streaming`) ------------------------------------------------------

    def streamer(self) -> FeishuStreamer | FeishuCardStreamer | None:
        s = self.settings
        if not s.app_id or not s.app_secret or s.streaming is StreamingMode.OFF:
            return None
        if s.streaming is StreamingMode.NATIVE:
            return FeishuCardStreamer(self, FeishuStreamer(self))
        return FeishuStreamer(self)


def _reply_target(message: OutboundMessage) -> tuple[str | None, bool]:
    """The message to answer with /reply (and whether in its thread), or None to post in the chat."""
    replied = message.metadata.get("reply_feishu_message_id")
    if isinstance(replied, str) and replied:
        return replied, bool(message.metadata.get("reply_feishu_in_thread"))
    # A reply without its event (a scheduled job) for a thread session: the thread's root.
    if message.thread_id and message.thread_id.startswith("om_"):
        return message.thread_id, True
    return None, False


def _sent_bytes(char: str) -> int:
    """What one character weighs in the request: UTF-8, JSON-escaped twice (content is a JSON string)."""
    once = json.dumps(char, ensure_ascii=False)[1:-1]
    return len(json.dumps(once, ensure_ascii=False)[1:-1].encode())
