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
"""

from __future__ import annotations

from typing import Literal

import structlog
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, ChannelSettings, SendResult
from app.errors import ChannelAuthError, ChannelNotConfigured, ChannelSendAuthError, InvalidPayload
from app.events import ChatType, InboundEvent, OutboundMessage
from channels.common.chunks import ChunkProgress, send_chunks
from channels.common.wechat_api import Errcodes, TokenApi, call_json, outbound_text, split_utf8
from channels.common.wechat_callback import message_of, open_encrypted, parse_callback, require_fresh
from channels.common.wechat_crypto import WeChatCrypto, sha1_signature, signature_matches

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


class WeChatMpChannel:
    name = "wechat-mp"

    def __init__(self, settings: WeChatMpSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self._crypto: WeChatCrypto | None = None
        self._api = TokenApi(context.http, settings, self._fetch_token, ERRCODES, channel="wechat_mp")
        self.tokens = self._api.tokens
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
        await self.context.accept([event])
        return _success()

    # --- outbound ---------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        text = outbound_text(message.parts)
        if not text.strip():
            return SendResult()
        pieces = split_utf8(text, self.settings.max_text_bytes)
        limit = max(1, self.settings.max_messages_per_reply)
        if len(pieces) > limit:
            # WeChat refuses more (45047); say so rather than lose the cut silently.
            pieces = [*pieces[: limit - 1], _truncated(pieces[limit - 1], self.settings.max_text_bytes)]

        async def deliver(_index: int, piece: str) -> None:
            await self._api.post(
                "/cgi-bin/message/custom/send",
                {"touser": message.chat_id, "msgtype": "text", "text": {"content": piece}},
            )

        await send_chunks(self._progress, message.message_id, pieces, deliver)
        return SendResult()

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
