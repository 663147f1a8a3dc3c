"""QQ official bot API over its HTTP callback (`POST /channels/qq`).

Inbound: every callback is verified with Ed25519 (key derived from `QQ_APP_SECRET`)
before it is parsed; the callback-URL validation (op 13) is answered with the signed
`plain_token`; `C2C_MESSAGE_CREATE` (private chat) and `GROUP_AT_MESSAGE_CREATE` (a
group message that @-mentions the bot) become events, deduplicated on the message id.

Outbound: replies go through the REST API (`/v2/users/{openid}/messages`,
`/v2/groups/{group_openid}/messages`) with an app access token fetched from the token
endpoint and cached until shortly before it expires. A reply to a message is a
"passive" message: it carries the original `msg_id` and a `msg_seq` that grows with
each message sent for that `msg_id` (the platform refuses a repeated pair).

Chat ids are `user:<user_openid>` and `group:<group_openid>`.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from typing import Any

import httpx
import structlog

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    InvalidPayload,
)
from app.events import (
    APPROVAL_KEY,
    ChatType,
    FilePart,
    ImagePart,
    InboundEvent,
    MentionPart,
    OutboundMessage,
    Part,
    TextPart,
)
from channels.common.media import (
    Media,
    MediaTooLarge,
    download_capped,
    inline_media,
    tell_too_large,
)
from channels.common.progress import ProgressStreamer
from channels.qq import signing
from channels.qq.attachments import attachment_part
from channels.qq.attachments import clean_str as _str
from channels.qq.interactions import approval_body, parse_interaction
from channels.qq.settings import QQSettings

log = structlog.get_logger(__name__)

OP_DISPATCH = 0
OP_CALLBACK_ACK = 12
OP_VALIDATION = 13

MESSAGE_EVENTS = {"C2C_MESSAGE_CREATE", "GROUP_AT_MESSAGE_CREATE"}
_TOKEN_MARGIN_SECONDS = 50  # the platform issues a fresh token in the last 60 s of the old one
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_\-]{1,128}")
_KEPT = 10_000
_DUPLICATE_MSG_SEQ = 40054005  # "消息被去重": this (msg_id, msg_seq) was delivered already


class _AlreadyDelivered(ChannelRejected):
    """The platform has this passive reply already (an earlier attempt got through)."""


class QQChannel:
    name = "qq"

    def __init__(self, settings: QQSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self._key = signing.private_key(settings.app_secret) if settings.app_secret else None
        self._token: str | None = None
        self._token_expires = 0.0
        self._token_lock = asyncio.Lock()
        # msg_seq = a per-process base + a counter per msg_id: after a restart the numbers
        # differ from the ones used before, so a new reply is never taken for a duplicate.
        self._seq_base = int(time.time()) % 100_000_000
        self._next_seq: OrderedDict[str, int] = OrderedDict()  # msg_id -> last msg_seq used
        self._seq_of: OrderedDict[tuple[str, int], int] = OrderedDict()  # (outbound id, chunk) -> seq
        # Chunks of an outbound message already delivered, so a retry sends only the rest.
        self._delivered: OrderedDict[tuple[str, int], str | None] = OrderedDict()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    # --- inbound -----------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path.strip("/") != "":
            return ChannelResponse.json({"error": "not_found", "detail": "POST /channels/qq"}, 404)
        if self._key is None or not self.settings.app_id:
            raise ChannelNotConfigured("QQ_APP_ID and QQ_APP_SECRET must be set on this server")
        appid = request.headers.get("x-bot-appid")
        if appid is not None and appid.strip() != self.settings.app_id:
            raise ChannelAuthError("X-Bot-Appid is not this bot's AppID")
        signed = signing.SIGNATURE_HEADER in request.headers
        if signed:
            signing.verify(
                self._key,
                request.headers.get(signing.SIGNATURE_HEADER),
                request.headers.get(signing.TIMESTAMP_HEADER),
                request.body,
                tolerance=self.settings.timestamp_tolerance_seconds,
            )
        payload = request.json()
        if not isinstance(payload, dict):
            raise InvalidPayload("body must be a JSON object")
        op = payload.get("op")
        if op == OP_VALIDATION:
            return self._answer_validation(payload, signed=signed)
        if not signed:
            raise ChannelAuthError("missing X-Signature-Ed25519 header")
        kind = payload.get("t")
        if op == OP_DISPATCH and isinstance(kind, str) and kind in MESSAGE_EVENTS:
            event = await self._with_media(self.parse_message(payload))
            if event is not None:
                await self.context.accept([event])
        elif op == OP_DISPATCH and kind == "INTERACTION_CREATE":  # a button press (docs/events.md)
            pressed = parse_interaction(payload, channel=self.name, scope=self.settings.session_scope)
            if pressed is not None:
                await self.context.accept([pressed])  # committed before QQ hears back
                await self._answer_interaction(str(pressed.metadata["reply_event_id"]))
        return ChannelResponse.json({"op": OP_CALLBACK_ACK, "d": 0})

    async def _answer_interaction(self, interaction_id: str) -> None:
        """`PUT /interactions/{id}` with `code: 0`, or the button keeps spinning; best-effort."""
        try:
            await self._api("PUT", f"/interactions/{interaction_id}", {"code": 0})
        except (ChannelRejected, ChannelUnavailable, ChannelSendAuthError, ChannelRateLimited) as exc:
            log.warning("qq_interaction_answer_failed", interaction=interaction_id, error=str(exc))

    def _answer_validation(self, payload: dict[str, Any], *, signed: bool) -> ChannelResponse:
        assert self._key is not None
        d = payload.get("d")
        if not isinstance(d, dict):
            raise InvalidPayload("validation request without d")
        plain_token, event_ts = d.get("plain_token"), d.get("event_ts")
        if not isinstance(plain_token, str) or not isinstance(event_ts, str | int):
            raise InvalidPayload("validation request needs d.plain_token and d.event_ts")
        event_ts = str(event_ts)
        # An unsigned validation must not turn us into a signing oracle: what we sign is
        # event_ts + plain_token, and a forged callback's signed text (timestamp + body)
        # always contains "{", which these restrictions exclude.
        if not signed and (not event_ts.isdigit() or not _SAFE_TOKEN.fullmatch(plain_token)):
            raise ChannelAuthError("unsigned validation request with unexpected characters")
        signature = signing.sign(self._key, (event_ts + plain_token).encode())
        return ChannelResponse.json({"plain_token": plain_token, "signature": signature})

    def parse_message(self, payload: dict[str, Any]) -> InboundEvent:
        kind = payload["t"]
        d = payload.get("d")
        if not isinstance(d, dict):
            raise InvalidPayload(f"{kind} without d")
        author = d.get("author")
        author = author if isinstance(author, dict) else {}
        message_id = _str(d.get("id"))
        parts: list[Part] = []
        if kind == "C2C_MESSAGE_CREATE":
            sender = _str(author.get("user_openid")) or _str(author.get("id"))
            chat_id, chat_type = f"user:{sender}", ChatType.DIRECT
        else:
            group = _str(d.get("group_openid"))
            if not group:
                raise InvalidPayload("GROUP_AT_MESSAGE_CREATE without group_openid")
            sender = _str(author.get("member_openid")) or _str(author.get("id"))
            chat_id, chat_type = f"group:{group}", ChatType.GROUP
            parts.append(MentionPart(user_id=self.settings.app_id or "", is_self=True))
        if not sender:
            raise InvalidPayload(f"{kind} without an author openid")
        content = d.get("content")
        if isinstance(content, str) and content.strip():
            parts.append(TextPart(text=content.strip()))
        for att in d.get("attachments") or []:
            if isinstance(att, dict):
                parts.append(attachment_part(att))
        if not any(isinstance(p, TextPart | ImagePart | FilePart) for p in parts):
            parts.append(TextPart(text=""))
        event_id = _str(payload.get("id"))
        metadata: dict[str, Any] = {}
        if message_id:
            metadata["reply_msg_id"] = message_id
        if event_id:
            metadata["reply_event_id"] = event_id
        external = f"msg:{message_id}" if message_id else (f"event:{event_id}" if event_id else None)
        return InboundEvent(
            channel=self.name,
            chat_id=chat_id,
            sender_id=sender,
            chat_type=chat_type,
            parts=tuple(parts),
            external_id=external,
            session_scope=self.settings.session_scope,
            metadata=metadata,
        )

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """Images (and, with speech to text, voice without the platform's transcript; and,
        when the gateway keeps received files, every other attachment) downloaded from
        their URLs as data; over `QQ_MEDIA_MAX_BYTES` a polite reply and
        None (nothing is stored)."""
        limit = self.settings.media_max_bytes

        async def fetch(part: ImagePart | FilePart) -> Media | None:
            return await download_capped(self.context.fetcher, part.url, limit) if part.url else None

        try:
            return await inline_media(
                event,
                fetch,
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,  # kept in the session's workspace
            )
        except MediaTooLarge as exc:
            await tell_too_large(self.send, event, self.settings.locale, exc.limit)
            return None

    # --- outbound ----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        kind, _, target = message.chat_id.partition(":")
        if kind == "user" and target:
            base = f"/v2/users/{target}"
        elif kind == "group" and target:
            base = f"/v2/groups/{target}"
        else:
            raise ChannelRejected(f"not a QQ chat id: {message.chat_id!r}")
        bodies: list[dict[str, Any]] = [
            {"content": text, "msg_type": 0}
            for text in _split(message.text, self.settings.max_text_chars)
            if text
        ]
        if bodies and self.settings.approval_buttons and APPROVAL_KEY in message.metadata:
            # The prompt's last message carries the Approve/Deny keyboard (markdown).
            last = str(bodies[-1]["content"])
            bodies[-1] = approval_body(last, message.metadata[APPROVAL_KEY], self.settings.locale)
        links = [p.url for p in message.parts if isinstance(p, FilePart) and p.url]
        if links:  # files need a platform upload the bot may not be allowed; a link always works
            bodies.append({"content": "\n".join(links), "msg_type": 0})
        images = [p for p in message.parts if isinstance(p, ImagePart) and (p.url or p.data_base64)]
        msg_id = message.metadata.get("reply_msg_id")
        # Without a message to answer (a button press), the event id makes the reply passive.
        reply_key = "msg_id" if msg_id else "event_id"
        msg_id = msg_id or message.metadata.get("reply_event_id")
        sent: str | None = None
        items: list[dict[str, Any] | ImagePart] = [*bodies, *images]
        for index, item in enumerate(items):
            done = (message.message_id, index)
            if done in self._delivered:
                sent = self._delivered[done]
                continue
            if isinstance(item, ImagePart):
                # Rich media: upload first (the platform fetches the URL), then send its file_info.
                upload: dict[str, Any] = {"file_type": 1, "srv_send_msg": False}
                if item.url:
                    upload["url"] = item.url
                else:
                    upload["file_data"] = item.data_base64
                info = await self._api("POST", f"{base}/files", upload)
                file_info = info.get("file_info") if isinstance(info, dict) else None
                if not file_info:
                    raise ChannelRejected("QQ did not return file_info for the uploaded image")
                body: dict[str, Any] = {"msg_type": 7, "media": {"file_info": file_info}}
            else:
                body = dict(item)
            if msg_id:
                body[reply_key] = str(msg_id)
                body["msg_seq"] = self._seq(str(msg_id), message.message_id, index)
            try:
                try:
                    data = await self._api("POST", f"{base}/messages", body)
                except ChannelRejected as exc:
                    if "keyboard" not in body or isinstance(exc, _AlreadyDelivered):
                        raise
                    # Markdown or keyboards not granted to this bot: the prompt as text.
                    log.warning("qq_approval_buttons_refused", error=str(exc))
                    body = {k: v for k, v in body.items() if k not in ("keyboard", "markdown")}
                    body.update(
                        msg_type=0, content=str(item["markdown"]["content"]) if isinstance(item, dict) else ""
                    )
                    if msg_id:
                        body["msg_seq"] = self._seq(str(msg_id), f"{message.message_id}:text", index)
                    data = await self._api("POST", f"{base}/messages", body)
            except _AlreadyDelivered:
                log.info("qq_reply_already_delivered", msg_id=msg_id, msg_seq=body.get("msg_seq"))
                data = None
            sent = _str(data.get("id")) if isinstance(data, dict) else None
            self._delivered[done] = sent
            while len(self._delivered) > _KEPT:
                self._delivered.popitem(last=False)
        return SendResult(platform_message_id=sent)

    # --- progress (`app.streaming`) ---------------------------------------------------

    def streamer(self) -> ProgressStreamer | None:
        """A 'working…' notice when configured; it uses one of the message's passive replies."""
        if self.settings.working_notice_seconds is None:
            return None
        return ProgressStreamer(
            self.send, locale=self.settings.locale, notice_after=self.settings.working_notice_seconds
        )

    def _seq(self, msg_id: str, outbound_id: str, index: int) -> int:
        """The msg_seq of one chunk: new chunks count up; a retried chunk keeps its number."""
        key = (outbound_id, index)
        if key in self._seq_of:
            return self._seq_of[key]
        seq = self._next_seq.get(msg_id, self._seq_base) + 1
        self._next_seq[msg_id] = seq
        self._next_seq.move_to_end(msg_id)
        self._seq_of[key] = seq
        while len(self._next_seq) > _KEPT:
            self._next_seq.popitem(last=False)
        while len(self._seq_of) > _KEPT:
            self._seq_of.popitem(last=False)
        return seq

    async def _api(self, method: str, path: str, body: dict[str, Any]) -> Any:
        for attempt in (1, 2):
            token = await self._access_token()
            try:
                resp = await self.context.http.request(
                    method,
                    f"{self.settings.api_base_url.rstrip('/')}{path}",
                    json=body,
                    headers={"Authorization": f"QQBot {token}", "X-Union-Appid": self.settings.app_id or ""},
                    timeout=self.settings.api_timeout_seconds,
                )
            except httpx.HTTPError as exc:
                raise ChannelUnavailable(f"QQ OpenAPI unreachable: {exc!r}") from exc
            if resp.status_code == 401 and attempt == 1:
                self._forget_token(token)  # expired or revoked early: fetch a fresh one once
                continue
            return _checked(resp)
        raise AssertionError("unreachable")

    def _forget_token(self, token: str) -> None:
        if self._token == token:
            self._token, self._token_expires = None, 0.0

    async def _access_token(self) -> str:
        async with self._token_lock:
            if self._token and time.monotonic() < self._token_expires:
                return self._token
            if not self.settings.app_id or not self.settings.app_secret:
                raise ChannelSendAuthError("QQ_APP_ID and QQ_APP_SECRET are needed to send")
            try:
                resp = await self.context.http.post(
                    self.settings.token_url,
                    json={"appId": self.settings.app_id, "clientSecret": self.settings.app_secret},
                    timeout=self.settings.api_timeout_seconds,
                )
            except httpx.HTTPError as exc:
                raise ChannelUnavailable(f"QQ token endpoint unreachable: {exc!r}") from exc
            if resp.status_code >= 500 or resp.status_code == 429:
                raise ChannelUnavailable(f"QQ token endpoint answered {resp.status_code}")
            try:
                data = resp.json()
            except ValueError:
                data = None
            token = data.get("access_token") if isinstance(data, dict) else None
            if resp.status_code >= 400 or not token:
                detail = data.get("message") if isinstance(data, dict) else resp.text[:200]
                raise ChannelSendAuthError(f"QQ refused our AppID/AppSecret: {detail}")
            try:
                lifetime = float(data.get("expires_in", 7200))
            except (TypeError, ValueError):
                lifetime = 7200.0
            self._token = str(token)
            self._token_expires = time.monotonic() + max(0.0, lifetime - _TOKEN_MARGIN_SECONDS)
            return self._token


def _checked(resp: httpx.Response) -> Any:
    """The JSON of a successful OpenAPI answer; a typed `DeliveryError` otherwise."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    code = data.get("code") if isinstance(data, dict) else None
    message = data.get("message") if isinstance(data, dict) else None
    detail = f"QQ OpenAPI answered {resp.status_code}" + (f": {code} {message}" if code else "")
    if resp.status_code == 401:
        raise ChannelSendAuthError(detail)
    if resp.status_code == 429:
        raise ChannelRateLimited(_retry_after(resp), detail)
    if resp.status_code >= 500 or resp.status_code == 408:
        raise ChannelUnavailable(detail)
    if code == _DUPLICATE_MSG_SEQ:
        raise _AlreadyDelivered(detail)
    if resp.status_code >= 400:
        raise ChannelRejected(detail)
    return data


def _split(text: str, limit: int) -> list[str]:
    chunks = []
    while len(text) > limit:
        cut = text.rfind("\n", 0, limit)
        if cut <= limit // 2:
            cut = limit
        chunks.append(text[:cut])
        text = text[cut:].lstrip("\n")
    chunks.append(text)
    return chunks


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0
