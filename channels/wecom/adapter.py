"""WeCom (企业微信) self-built app callback and application-message API.

Inbound: WeCom GETs the callback URL once to verify it (the answer is the decrypted
`echostr`), then POSTs every message as encrypted XML. We verify the signature, decrypt,
check the receive id (our CorpID), commit the event to the inbox and answer at once with
an empty body — WeCom's "no passive reply" — because the agent may need longer than the
5 s WeCom waits before retrying.

Outbound: the reply is sent later through `cgi-bin/message/send` with an access token from
`cgi-bin/gettoken`, cached until shortly before it expires and refreshed once when WeCom
says it is no longer valid.

Media: an inbound image (and, with speech to text, a voice message; and, when the gateway
keeps received files in per-session workspaces, a video or file message) is downloaded by
its `MediaId` (`cgi-bin/media/get`) under `WECOM_MEDIA_MAX_BYTES` before the event is
stored; images and files of a reply
are uploaded as temporary media (`cgi-bin/media/upload`) and sent as image/file messages
after its text. WeCom cannot edit a sent message: progress is at most one "working…"
notice (`WECOM_WORKING_NOTICE_SECONDS`).
"""

from __future__ import annotations

from typing import Any

import structlog
from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, ChannelSettings, SendResult
from app.errors import (
    ChannelAuthError,
    ChannelForbidden,
    ChannelNotConfigured,
    ChannelRejected,
    ChannelSendAuthError,
    DeliveryError,
    InvalidPayload,
)
from app.events import APPROVAL_KEY, ChatType, FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming.protocol import StreamingMode
from channels.common.chunks import ChunkProgress, send_chunks
from channels.common.media import Media, MediaTooLarge, inline_media, too_large_text
from channels.common.progress import ProgressStreamer, check_streaming
from channels.common.wechat_api import Errcodes, TokenApi, call_json, split_utf8
from channels.common.wechat_callback import message_of, open_encrypted, parse_callback, require_fresh
from channels.common.wechat_crypto import WeChatCrypto
from channels.common.wechat_media import Upload, WeChatMedia, reply_text, uploads
from channels.common.wechat_xml import WeChatMessage
from channels.wecom.native import CARD_EVENT, approval_card, card_press

log = structlog.get_logger(__name__)

# WeCom global error codes (developer.work.weixin.qq.com/document/path/90455).
TOKEN_INVALID = frozenset({40014, 42001, 41001})  # invalid, expired, missing access_token
RATE_LIMITED = frozenset({45009, 45033})  # API frequency limit, concurrency limit
AUTH_FAILED = frozenset({40001, 40013, 40056, 41002, 41004, 40091, 42009, 48002, 60020})
ERRCODES = Errcodes(TOKEN_INVALID, RATE_LIMITED, AUTH_FAILED)
APPCHAT_PREFIX = "appchat:"


class WeComSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="WECOM_", env_file=".env", extra="ignore")

    corp_id: str | None = Field(None, description="CorpID (我的企业 → 企业ID); the callbacks' receive id.")
    corp_secret: str | None = Field(None, description="The app's Secret, for gettoken.")
    agent_id: int | None = Field(None, description="The app's AgentId; replies are sent as this app.")
    token: str | None = Field(None, description="Callback Token (接收消息 → API接收).")
    encoding_aes_key: str | None = Field(None, description="Callback EncodingAESKey (43 characters).")
    api_base_url: str = Field("https://qyapi.weixin.qq.com", description="WeCom API base URL.")
    timestamp_tolerance_seconds: int = Field(
        300,
        description="Refuse callbacks whose timestamp is further from now; 0 disables "
        "(WeCom itself does not require the check).",
    )
    max_text_bytes: int = Field(2048, description="Longer replies are split (WeCom's text limit).")
    rate_limit_retry_seconds: float = Field(60.0, description="Wait after WeCom's rate-limit errcodes.")
    max_body_bytes: int = Field(64 * 1024, description="Larger request bodies get 413.")
    media_max_bytes: int = Field(
        10_000_000,
        ge=1,
        description="Larger images, voice, videos and files are refused with a polite reply (media/get).",
    )
    streaming: StreamingMode = Field(
        StreamingMode.OFF, description="off only: WeCom cannot edit a sent message (no previews)."
    )
    working_notice_seconds: float | None = Field(
        None, gt=0, description="Send one short 'working…' notice when a turn runs longer; unset: none."
    )

    approval_buttons: bool = Field(
        False,
        description="Follow approval prompts with a template card (button_interaction) with "
        "Approve/Deny buttons; a press decides as /approve or /deny by the presser. Off: the "
        "prompt is text and `/approve <id>` is typed.",
    )

    @field_validator("streaming")
    @classmethod
    def _no_previews(cls, value: StreamingMode) -> StreamingMode:
        return check_streaming("WeCom", value, (StreamingMode.OFF,))


class WeComChannel:
    name = "wecom"

    def __init__(self, settings: WeComSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self._crypto: WeChatCrypto | None = None
        self._api = TokenApi(context.http, settings, self._fetch_token, ERRCODES, channel="wecom")
        self.tokens = self._api.tokens
        self._media = WeChatMedia(self._api, context.fetcher)
        self._progress = ChunkProgress()

    async def start(self) -> None:
        s = self.settings
        if s.token and s.encoding_aes_key and s.corp_id:
            # A malformed key is an operator error: fail at start-up, not on the first message.
            self._crypto = WeChatCrypto(s.token, s.encoding_aes_key, s.corp_id)

    async def stop(self) -> None:
        return None

    # --- inbound ----------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.path not in ("", "/") or request.method not in ("GET", "POST"):
            return ChannelResponse.json({"error": "not_found", "detail": "GET or POST /channels/wecom"}, 404)
        crypto = self._require_crypto()
        query = request.query
        timestamp, nonce = query.get("timestamp", ""), query.get("nonce", "")
        signature = query.get("msg_signature")
        if not signature:
            raise ChannelAuthError("msg_signature is missing")
        require_fresh(timestamp, nonce, self.settings.timestamp_tolerance_seconds)
        if request.method == "GET":
            return self._verify_url(crypto, signature, timestamp, nonce, query.get("echostr"))
        return await self._callback(crypto, signature, timestamp, nonce, request.body)

    def _verify_url(
        self, crypto: WeChatCrypto, signature: str, timestamp: str, nonce: str, echostr: str | None
    ) -> ChannelResponse:
        if not echostr:
            raise InvalidPayload("echostr is required to verify the URL")
        # A '+' sent without URL-encoding arrives as a space; base64 has no spaces.
        echostr = echostr.replace(" ", "+")
        plain = open_encrypted(crypto, signature, timestamp, nonce, echostr, receive_id="CorpID")
        return ChannelResponse.text(plain)

    async def _callback(
        self, crypto: WeChatCrypto, signature: str, timestamp: str, nonce: str, body: bytes
    ) -> ChannelResponse:
        outer = parse_callback(body)
        encrypt = outer.get("Encrypt")
        if not encrypt:
            raise InvalidPayload("callback XML has no Encrypt element")
        inner = parse_callback(
            open_encrypted(crypto, signature, timestamp, nonce, encrypt, receive_id="CorpID")
        )
        message = message_of(inner)
        agent = inner.get("AgentID") or outer.get("AgentID")
        if self.settings.agent_id is not None and agent and agent != str(self.settings.agent_id):
            raise ChannelForbidden(f"AgentID {agent[:20]!r} is not this app")
        if (message.event or "").lower() == CARD_EVENT:  # a template card button press
            press = card_press(message, scope=self.settings.session_scope, agent=agent)
            if press is None:
                log.info("wecom_card_event_without_key", task_id=message.fields.get("TaskId"))
            else:
                await self.context.accept([press])
            return _no_passive_reply()
        parts = message.parts()
        if parts is None:
            log.info("wecom_event_ignored", msg_type=message.msg_type, wecom_event=message.event)
            return _no_passive_reply()
        event = InboundEvent(
            channel=self.name,
            chat_id=message.from_user,
            sender_id=message.from_user,
            chat_type=ChatType.DIRECT,  # app callbacks are one member talking to the app
            parts=parts,
            external_id=message.dedup_id(),
            session_scope=self.settings.session_scope,
            metadata={**message.metadata(), "agent_id": agent},
        )
        try:
            event = await self._with_media(event, message)
        except MediaTooLarge as exc:
            await self._too_large(event, exc.limit)
            return _no_passive_reply()
        await self.context.accept([event])
        return _no_passive_reply()

    async def _with_media(self, event: InboundEvent, message: WeChatMessage) -> InboundEvent:
        media_id = message.fields.get("MediaId")
        limit = self.settings.media_max_bytes

        async def fetch(_part: ImagePart | FilePart) -> Media | None:
            return await self._media.download(media_id, limit) if media_id else None

        return await inline_media(
            event,
            fetch,
            transcribe=self.context.transcribe,
            channel=self.name,
            files=self.context.keeps_files,  # videos and files, kept in the session's workspace
        )

    async def _too_large(self, event: InboundEvent, limit: int) -> None:
        try:  # best-effort: WeCom already has its answer
            await self._send_text(event.chat_id, too_large_text(self.settings.locale, limit))
        except DeliveryError as exc:
            log.warning("wecom_too_large_reply_failed", error=exc.detail)

    def _require_crypto(self) -> WeChatCrypto:
        if self._crypto is None:
            raise ChannelNotConfigured(
                "WECOM_CORP_ID, WECOM_TOKEN and WECOM_ENCODING_AES_KEY must be set on this server"
            )
        return self._crypto

    # --- outbound ---------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        """The text (split), then each image or file: uploaded, then sent by its media_id.

        Each piece and each upload is one step of the outbox delivery: a retry resumes
        at the step that failed.
        """
        text = reply_text(message.parts)
        pieces = split_utf8(text, self.settings.max_text_bytes) if text.strip() else []
        media = uploads(message.parts)
        card = self._approval_card(message)
        if not pieces and not media and card is None:
            return SendResult()

        async def deliver(index: int, piece: str) -> str | None:
            if card is not None and index == len(pieces) + len(media):
                return await self._send_card(message.chat_id, card)
            if index >= len(pieces):
                return await self._send_media(message.chat_id, media[index - len(pieces)])
            return await self._send_text(message.chat_id, piece)

        items = [*pieces, *(f"media:{i}" for i in range(len(media))), *(["card"] if card else [])]
        sent = await send_chunks(self._progress, message.message_id, items, deliver)
        return SendResult(platform_message_id=next((s for s in reversed(sent) if s), None))

    async def _send_text(self, chat_id: str, content: str) -> str | None:
        return await self._send_message(chat_id, "text", {"content": content})

    def _approval_card(self, message: OutboundMessage) -> dict[str, Any] | None:
        """Approve/Deny buttons after an approval prompt (`WECOM_APPROVAL_BUTTONS`), sent as
        a message of their own: WeCom cannot add buttons to a sent text. App messages only
        (a group chat made by the app, `appchat:`, gets none)."""
        if not self.settings.approval_buttons or APPROVAL_KEY not in message.metadata:
            return None
        if message.chat_id.startswith(APPCHAT_PREFIX):
            return None
        approval = str(message.metadata[APPROVAL_KEY])
        return approval_card(approval, message.message_id, self.settings.locale)

    async def _send_card(self, chat_id: str, card: dict[str, Any]) -> str | None:
        try:
            return await self._send_message(chat_id, "template_card", card)
        except ChannelRejected as exc:
            # The prompt is already sent as text; `/approve <id>` typed still works.
            log.warning("wecom_approval_card_refused", error=exc.detail)
            return None

    async def _send_media(self, chat_id: str, item: Upload) -> str | None:
        media_id = await self._media.upload(item)
        return await self._send_message(chat_id, item.kind, {"media_id": media_id})

    async def _send_message(self, chat_id: str, msgtype: str, content: dict[str, Any]) -> str | None:
        if chat_id.startswith(APPCHAT_PREFIX):
            path = "/cgi-bin/appchat/send"
            body: dict[str, Any] = {"chatid": chat_id[len(APPCHAT_PREFIX) :], "msgtype": msgtype}
        else:
            if self.settings.agent_id is None:
                raise ChannelSendAuthError("WECOM_AGENT_ID is not set; cannot send app messages")
            path = "/cgi-bin/message/send"
            body = {"touser": chat_id, "msgtype": msgtype, "agentid": self.settings.agent_id}
        body[msgtype] = content
        data = await self._api.post(path, body)
        return str(data["msgid"]) if data.get("msgid") else None

    # --- progress (`app.streaming`) ---------------------------------------------------

    def streamer(self) -> ProgressStreamer | None:
        if self.settings.working_notice_seconds is None:
            return None
        return ProgressStreamer(
            self.send, locale=self.settings.locale, notice_after=self.settings.working_notice_seconds
        )

    async def _fetch_token(self) -> tuple[str, float]:
        s = self.settings
        if not s.corp_id or not s.corp_secret:
            raise ChannelSendAuthError("WECOM_CORP_ID and WECOM_CORP_SECRET must be set to send")
        data = await call_json(
            self.context.http,
            "GET",
            self._api.base_url + "/cgi-bin/gettoken",
            what="gettoken",
            params={"corpid": s.corp_id, "corpsecret": s.corp_secret},
        )
        return self._api.token_answer(data, "gettoken")


def _no_passive_reply() -> ChannelResponse:
    return ChannelResponse(status=200, body=b"", content_type="text/plain; charset=utf-8")
