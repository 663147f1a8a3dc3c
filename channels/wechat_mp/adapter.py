"""WeChat Official Account (公众号) server callback and customer-service message API.

Inbound, in the mode chosen under 消息加解密方式:

- plaintext (明文模式): `signature` = SHA1 of sorted `[token, timestamp, nonce]`, the body
  is plain XML. The signature does not cover the body, so once an EncodingAESKey is
  configured plaintext callbacks are refused unless `WECHAT_MP_ALLOW_PLAINTEXT=true`.
- compatible/safe (兼容/安全模式): `encrypt_type=aes`, `msg_signature` over the `Encrypt`
  element, AES with the AppID as receive id.

URL verification (GET) is always plaintext: `echostr` is returned as is. A message is
committed to the inbox and answered at once with `success`; the agent's reply goes out
later through `cgi-bin/message/custom/send` (客服消息), because WeChat only waits 5 s.

Media: a voice message with WeChat's speech recognition arrives as its transcript
(`Recognition`); an image (and, with speech to text, a voice message without one) is
downloaded by its `MediaId` (`cgi-bin/media/get`) before the event is stored; so are
videos and short videos when the gateway keeps received files in per-session workspaces. Images of a
reply are uploaded as temporary media (`cgi-bin/media/upload?type=image`) and sent as
image messages; the Official Account has no file messages, so a file is named in the text.
While a turn runs the user sees "typing" (`cgi-bin/message/custom/typing`,
`WECHAT_MP_STREAMING=native`, the default), at most every 15 s as WeChat allows.

Follows and unfollows (`subscribe` / `unsubscribe`) are `joined` / `left` events
(`channels.wechat_mp.native`, docs/events.md).
"""

from __future__ import annotations

from typing import Literal

import structlog
from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, ChannelSettings, SendResult
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelSendAuthError,
    DeliveryError,
    InvalidPayload,
)
from app.events import ChatType, FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming.protocol import StreamingMode
from channels.common.chunks import ChunkProgress, send_chunks
from channels.common.media import Media, MediaTooLarge, inline_media, too_large_text
from channels.common.progress import ProgressStreamer, check_streaming
from channels.common.wechat_api import Errcodes, TokenApi, call_json, split_utf8
from channels.common.wechat_callback import message_of, open_encrypted, parse_callback, require_fresh
from channels.common.wechat_crypto import WeChatCrypto, sha1_signature, signature_matches
from channels.common.wechat_media import Upload, WeChatMedia, reply_text, uploads
from channels.common.wechat_xml import WeChatMessage
from channels.wechat_mp.native import follow_event

log = structlog.get_logger(__name__)

# Official Account global return codes.
TOKEN_INVALID = frozenset(
    {40001, 40014, 41001, 42001}
)  # in API answers: token invalid / not latest / expired
RATE_LIMITED = frozenset({45009, 45011})  # daily quota, per-minute frequency
AUTH_FAILED = frozenset({40013, 40125, 40164, 41002, 41004, 48001, 50001, 50002})
# Any other errcode rejects the message: 45015 (past the 48 h window), 45047 (reply quota
# used), 40003 (bad OpenID), 43004 (not subscribed), 45002 (too long).
ERRCODES = Errcodes(TOKEN_INVALID, RATE_LIMITED, AUTH_FAILED)


class WeChatMpSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="WECHAT_MP_", env_file=".env", extra="ignore")

    app_id: str | None = Field(None, description="AppID; the receive id of encrypted callbacks.")
    app_secret: str | None = Field(None, description="AppSecret, for the access token.")
    token: str | None = Field(None, description="Server configuration Token (服务器配置 → 令牌).")
    encoding_aes_key: str | None = Field(
        None, description="EncodingAESKey (43 characters); needed for compatible/safe mode."
    )
    previous_encoding_aes_key: str | None = Field(
        None, description="The key before the last rotation; tried when the current one fails."
    )
    allow_plaintext: bool | None = Field(
        None,
        description="Accept plaintext callbacks; default: only while no EncodingAESKey is set.",
    )
    api_base_url: str = Field("https://api.weixin.qq.com", description="WeChat API base URL.")
    token_endpoint: Literal["stable", "classic"] = Field(
        "stable",
        description="stable: POST cgi-bin/stable_token (safe with several replicas); "
        "classic: GET cgi-bin/token (each call replaces the previous token).",
    )
    timestamp_tolerance_seconds: int = Field(
        300, description="Refuse callbacks whose timestamp is further from now; 0 disables."
    )
    max_text_bytes: int = Field(2048, description="Longer replies are split.")
    max_messages_per_reply: int = Field(
        5, description="WeChat allows 5 customer-service messages per user message; the rest is cut."
    )
    rate_limit_retry_seconds: float = Field(60.0, description="Wait after WeChat's quota errcodes.")
    max_body_bytes: int = Field(64 * 1024, description="Larger request bodies get 413.")
    media_max_bytes: int = Field(
        10_000_000,
        ge=1,
        description="Larger images, voice and videos are refused with a polite reply (media/get).",
    )
    streaming: StreamingMode = Field(
        StreamingMode.NATIVE,
        description="native: the 'typing' state while a turn runs (custom/typing); off: none. "
        "No previews: WeChat cannot edit a sent message.",
    )
    working_notice_seconds: float | None = Field(
        None, gt=0, description="Send one short 'working…' notice when a turn runs longer; unset: none."
    )

    @field_validator("farewell_text")
    @classmethod
    def _no_farewell(cls, value: str) -> str:
        if value:
            raise ValueError(
                "WECHAT_MP_FAREWELL_TEXT cannot be delivered: WeChat sends nothing to a user who "
                "unfollowed (errcode 43004); leave it empty"
            )
        return value

    @field_validator("streaming")
    @classmethod
    def _no_previews(cls, value: StreamingMode) -> StreamingMode:
        return check_streaming("The Official Account", value, (StreamingMode.NATIVE, StreamingMode.OFF))


TYPING_SECONDS = 15.0  # a typing state lasts 15 s and cannot be renewed before (errcode 45081)


class WeChatMpChannel:
    name = "wechat-mp"

    def __init__(self, settings: WeChatMpSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self._crypto: WeChatCrypto | None = None
        self._api = TokenApi(context.http, settings, self._fetch_token, ERRCODES, channel="wechat_mp")
        self.tokens = self._api.tokens
        self._media = WeChatMedia(self._api, context.fetcher)
        self._progress = ChunkProgress()

    async def start(self) -> None:
        s = self.settings
        if s.token and s.encoding_aes_key and s.app_id:
            previous = [s.previous_encoding_aes_key] if s.previous_encoding_aes_key else []
            self._crypto = WeChatCrypto(s.token, s.encoding_aes_key, s.app_id, previous_aes_keys=previous)

    async def stop(self) -> None:
        return None

    @property
    def plaintext_allowed(self) -> bool:
        if self.settings.allow_plaintext is not None:
            return self.settings.allow_plaintext
        return not self.settings.encoding_aes_key

    # --- inbound ----------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.path not in ("", "/") or request.method not in ("GET", "POST"):
            return ChannelResponse.json(
                {"error": "not_found", "detail": "GET or POST /channels/wechat-mp"}, 404
            )
        token = self.settings.token
        if not token:
            raise ChannelNotConfigured("WECHAT_MP_TOKEN is not set on this server")
        query = request.query
        timestamp, nonce = query.get("timestamp", ""), query.get("nonce", "")
        require_fresh(timestamp, nonce, self.settings.timestamp_tolerance_seconds)
        if request.method == "GET":
            self._check_plain_signature(token, query.get("signature"), timestamp, nonce)
            echostr = query.get("echostr")
            if not echostr:
                raise InvalidPayload("echostr is required to verify the URL")
            return ChannelResponse.text(echostr)
        if query.get("encrypt_type", "raw").lower() == "aes":
            fields = self._decrypt(query.get("msg_signature"), timestamp, nonce, request.body)
        else:
            if not self.plaintext_allowed:
                raise ChannelAuthError("plaintext callbacks are refused: this server expects safe mode")
            self._check_plain_signature(token, query.get("signature"), timestamp, nonce)
            fields = parse_callback(request.body)
        return await self._accept(fields)

    def _check_plain_signature(self, token: str, signature: str | None, timestamp: str, nonce: str) -> None:
        if not signature:
            raise ChannelAuthError("signature is missing")
        if not signature_matches(sha1_signature(token, timestamp, nonce), signature):
            raise ChannelAuthError("signature does not match")

    def _decrypt(self, signature: str | None, timestamp: str, nonce: str, body: bytes) -> dict[str, str]:
        if self._crypto is None:
            raise ChannelNotConfigured(
                "encrypted callback, but WECHAT_MP_APP_ID or WECHAT_MP_ENCODING_AES_KEY is not set"
            )
        if not signature:
            raise ChannelAuthError("msg_signature is missing")
        encrypt = parse_callback(body).get("Encrypt")
        if not encrypt:
            raise InvalidPayload("encrypted callback XML has no Encrypt element")
        return parse_callback(
            open_encrypted(self._crypto, signature, timestamp, nonce, encrypt, receive_id="AppID")
        )

    async def _accept(self, fields: dict[str, str]) -> ChannelResponse:
        message = message_of(fields)
        follow = follow_event(message, scope=self.settings.session_scope, account=message.to_user)
        if follow is not None:  # subscribe / unsubscribe: joined / left (docs/events.md)
            await self.context.accept([follow])
            return _success()
        parts = message.parts()
        if parts is None:
            log.info("wechat_mp_event_ignored", msg_type=message.msg_type, wechat_event=message.event)
            return _success()
        event = InboundEvent(
            channel=self.name,
            chat_id=message.from_user,  # the user's OpenID
            sender_id=message.from_user,
            chat_type=ChatType.DIRECT,
            parts=parts,
            external_id=message.dedup_id(),
            session_scope=self.settings.session_scope,
            metadata={**message.metadata(), "account": message.to_user},
        )
        try:
            event = await self._with_media(event, message)
        except MediaTooLarge as exc:
            await self._too_large(event, exc.limit)
            return _success()
        await self.context.accept([event])
        return _success()

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
        text = too_large_text(self.settings.locale, limit)
        try:  # best-effort: WeChat already has its answer
            await self._custom_send(event.chat_id, "text", {"content": text})
        except DeliveryError as exc:
            log.warning("wechat_mp_too_large_reply_failed", error=exc.detail)

    # --- outbound ---------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        """The text (split), then each image: uploaded, then sent by its media_id.

        Each piece and each upload is one step of the outbox delivery: a retry resumes
        at the step that failed. Images count against the five messages per user message.
        """
        text = reply_text(message.parts, files=False)
        pieces = split_utf8(text, self.settings.max_text_bytes) if text.strip() else []
        media = uploads(message.parts, files=False)
        limit = max(1, self.settings.max_messages_per_reply)
        media = media[: max(0, limit - 1)] if pieces else media[:limit]
        text_limit = limit - len(media)
        if len(pieces) > text_limit:
            # WeChat refuses more (45047); say so rather than lose the cut silently.
            pieces = [
                *pieces[: text_limit - 1],
                _truncated(pieces[text_limit - 1], self.settings.max_text_bytes),
            ]
        if not pieces and not media:
            return SendResult()

        async def deliver(index: int, piece: str) -> None:
            if index >= len(pieces):
                await self._send_image(message.chat_id, media[index - len(pieces)])
            else:
                await self._custom_send(message.chat_id, "text", {"content": piece})

        items = [*pieces, *(f"media:{i}" for i in range(len(media)))]
        await send_chunks(self._progress, message.message_id, items, deliver)
        return SendResult()

    async def _send_image(self, openid: str, item: Upload) -> None:
        media_id = await self._media.upload(item)
        await self._custom_send(openid, "image", {"media_id": media_id})

    async def _custom_send(self, openid: str, msgtype: str, content: dict[str, str]) -> None:
        await self._api.post(
            "/cgi-bin/message/custom/send", {"touser": openid, "msgtype": msgtype, msgtype: content}
        )

    # --- progress (`app.streaming`) ---------------------------------------------------

    def streamer(self) -> ProgressStreamer | None:
        s = self.settings
        typing = s.streaming is StreamingMode.NATIVE
        if not typing and s.working_notice_seconds is None:
            return None
        return ProgressStreamer(
            self.send,
            locale=s.locale,
            notice_after=s.working_notice_seconds,
            show_typing=self._typing if typing else None,
            typing_every=TYPING_SECONDS,
        )

    async def _typing(self, message: OutboundMessage) -> None:
        await self._api.post(
            "/cgi-bin/message/custom/typing", {"touser": message.chat_id, "command": "Typing"}
        )

    async def _fetch_token(self) -> tuple[str, float]:
        s = self.settings
        if not s.app_id or not s.app_secret:
            raise ChannelSendAuthError("WECHAT_MP_APP_ID and WECHAT_MP_APP_SECRET must be set to send")
        base = self._api.base_url
        if s.token_endpoint == "stable":
            data = await call_json(
                self.context.http,
                "POST",
                base + "/cgi-bin/stable_token",
                what="stable_token",
                json_body={"grant_type": "client_credential", "appid": s.app_id, "secret": s.app_secret},
            )
        else:
            data = await call_json(
                self.context.http,
                "GET",
                base + "/cgi-bin/token",
                what="token",
                params={"grant_type": "client_credential", "appid": s.app_id, "secret": s.app_secret},
            )
        return self._api.token_answer(data, "access token")


def _success() -> ChannelResponse:
    return ChannelResponse.text("success")


def _truncated(piece: str, max_bytes: int) -> str:
    marker = "…"
    budget = max_bytes - len(marker.encode())
    while len(piece.encode()) > budget:
        piece = piece[:-1]
    return piece + marker
