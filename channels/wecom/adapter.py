"""WeCom (企业微信) self-built app callback and application-message API.

Inbound: WeCom GETs the callback URL once to verify it (the answer is the decrypted
`echostr`), then POSTs every message as encrypted XML. We verify the signature, decrypt,
check the receive id (our CorpID), commit the event to the inbox and answer at once with
an empty body — WeCom's "no passive reply" — because the agent may need longer than the
5 s WeCom waits before retrying.

Outbound: the reply is sent later through `cgi-bin/message/send` with an access token from
`cgi-bin/gettoken`, cached until shortly before it expires and refreshed once when WeCom
says it is no longer valid.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, ChannelSettings, SendResult
from app.errors import (
    ChannelAuthError,
    ChannelForbidden,
    ChannelNotConfigured,
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
    InvalidPayload,
)
from app.events import ChatType, InboundEvent, OutboundMessage
from channels.common.wechat_api import (
    SYSTEM_BUSY,
    AccessTokenCache,
    ChunkProgress,
    call_json,
    describe,
    errcode_of,
    outbound_text,
    split_utf8,
)
from channels.common.wechat_crypto import (
    DecryptError,
    ReceiveIdMismatch,
    SignatureMismatch,
    WeChatCrypto,
    timestamp_fresh,
)
from channels.common.wechat_xml import MalformedXml, UnsafeXml, WeChatMessage, parse_flat_xml

log = structlog.get_logger(__name__)

# WeCom global error codes (developer.work.weixin.qq.com/document/path/90455).
TOKEN_INVALID = {40014, 42001, 41001}  # invalid, expired, missing access_token
RATE_LIMITED = {45009, 45033}  # API frequency limit, concurrency limit
AUTH_FAILED = {40001, 40013, 40056, 41002, 41004, 40091, 42009, 48002, 60020}
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


class WeComChannel:
    name = "wecom"

    def __init__(self, settings: WeComSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self._crypto: WeChatCrypto | None = None
        self.tokens = AccessTokenCache(self._fetch_token)
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
        if not timestamp or not nonce:
            raise InvalidPayload("timestamp and nonce are required")
        if not timestamp_fresh(timestamp, self.settings.timestamp_tolerance_seconds, time.time()):
            raise ChannelAuthError("timestamp is malformed or too far from now")
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
        plain = _open(crypto, signature, timestamp, nonce, echostr)
        return ChannelResponse.text(plain)

    async def _callback(
        self, crypto: WeChatCrypto, signature: str, timestamp: str, nonce: str, body: bytes
    ) -> ChannelResponse:
        outer = _parse(body)
        encrypt = outer.get("Encrypt")
        if not encrypt:
            raise InvalidPayload("callback XML has no Encrypt element")
        inner = _parse(_open(crypto, signature, timestamp, nonce, encrypt))
        try:
            message = WeChatMessage.from_fields(inner)
        except MalformedXml as exc:
            raise InvalidPayload(str(exc)) from exc
        agent = inner.get("AgentID") or outer.get("AgentID")
        if self.settings.agent_id is not None and agent and agent != str(self.settings.agent_id):
            raise ChannelForbidden(f"AgentID {agent[:20]!r} is not this app")
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
        await self.context.accept([event])
        return _no_passive_reply()

    def _require_crypto(self) -> WeChatCrypto:
        if self._crypto is None:
            raise ChannelNotConfigured(
                "WECOM_CORP_ID, WECOM_TOKEN and WECOM_ENCODING_AES_KEY must be set on this server"
            )
        return self._crypto

    # --- outbound ---------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        text = outbound_text(message.parts)
        if not text.strip():
            return SendResult()
        pieces = split_utf8(text, self.settings.max_text_bytes)
        done = self._progress.delivered(message.message_id)
        platform_id: str | None = None
        for index in range(done, len(pieces)):
            platform_id = await self._send_text(message.chat_id, pieces[index])
            self._progress.record(message.message_id, index + 1)
        self._progress.forget(message.message_id)
        return SendResult(platform_message_id=platform_id)

    async def _send_text(self, chat_id: str, content: str) -> str | None:
        if chat_id.startswith(APPCHAT_PREFIX):
            path = "/cgi-bin/appchat/send"
            body: dict[str, Any] = {
                "chatid": chat_id[len(APPCHAT_PREFIX) :],
                "msgtype": "text",
                "text": {"content": content},
            }
        else:
            if self.settings.agent_id is None:
                raise ChannelSendAuthError("WECOM_AGENT_ID is not set; cannot send app messages")
            path = "/cgi-bin/message/send"
            body = {
                "touser": chat_id,
                "msgtype": "text",
                "agentid": self.settings.agent_id,
                "text": {"content": content},
            }
        data = await self._call(path, body)
        return str(data["msgid"]) if data.get("msgid") else None

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with the cached token; on an invalid/expired token refresh once and retry."""
        url = self.settings.api_base_url.rstrip("/") + path
        for attempt in (1, 2):
            token = await self.tokens.get()
            data = await call_json(
                self.context.http, "POST", url, what=path, params={"access_token": token}, json_body=body
            )
            code = errcode_of(data)
            if code in TOKEN_INVALID:
                self.tokens.invalidate(token)
                if attempt == 1:
                    log.info("wecom_token_refresh", errcode=code)
                    continue
                raise ChannelUnavailable(f"{path}: a fresh access token was refused too ({describe(data)})")
            if code != 0:
                raise self._error(path, data)
            return data
        raise AssertionError("unreachable")

    async def _fetch_token(self) -> tuple[str, float]:
        s = self.settings
        if not s.corp_id or not s.corp_secret:
            raise ChannelSendAuthError("WECOM_CORP_ID and WECOM_CORP_SECRET must be set to send")
        data = await call_json(
            self.context.http,
            "GET",
            s.api_base_url.rstrip("/") + "/cgi-bin/gettoken",
            what="gettoken",
            params={"corpid": s.corp_id, "corpsecret": s.corp_secret},
        )
        code = errcode_of(data)
        if code != 0 or not data.get("access_token"):
            if code in RATE_LIMITED:
                raise ChannelRateLimited(s.rate_limit_retry_seconds, f"gettoken: {describe(data)}")
            if code == SYSTEM_BUSY:
                raise ChannelUnavailable(f"gettoken: {describe(data)}")
            raise ChannelSendAuthError(f"gettoken refused our credentials: {describe(data)}")
        return str(data["access_token"]), float(data.get("expires_in") or 7200)

    def _error(self, path: str, data: dict[str, Any]) -> DeliveryError:
        code = errcode_of(data)
        detail = f"{path}: {describe(data)}"
        if code in RATE_LIMITED:
            return ChannelRateLimited(self.settings.rate_limit_retry_seconds, detail)
        if code == SYSTEM_BUSY:
            return ChannelUnavailable(detail)
        if code in AUTH_FAILED:
            return ChannelSendAuthError(detail)
        return ChannelRejected(detail)


def _no_passive_reply() -> ChannelResponse:
    return ChannelResponse(status=200, body=b"", content_type="text/plain; charset=utf-8")


def _parse(data: bytes | str) -> dict[str, str]:
    try:
        return parse_flat_xml(data)
    except (UnsafeXml, MalformedXml) as exc:
        raise InvalidPayload(str(exc)) from exc


def _open(crypto: WeChatCrypto, signature: str, timestamp: str, nonce: str, encrypt: str) -> str:
    try:
        return crypto.verify_and_decrypt(signature, timestamp, nonce, encrypt)
    except SignatureMismatch as exc:
        raise ChannelAuthError("msg_signature does not match") from exc
    except ReceiveIdMismatch as exc:
        raise ChannelForbidden("the message was encrypted for another CorpID") from exc
    except DecryptError as exc:
        raise InvalidPayload(f"Encrypt cannot be decrypted: {exc}") from exc
