"""Feishu/Lark channel: event subscription callback (`POST /channels/feishu`), Open API replies.

Inbound: Feishu POSTs schema 2.0 events, plain or encrypted (`{"encrypt": …}`) when an
Encrypt Key is set, and then signed (`X-Lark-Signature`). The signature is checked on the
raw body before anything else, the body decrypted, the verification token compared, and
an `im.message.receive_v1` message committed to the inbox and answered 200 at once
(Feishu redelivers events it got no answer for within a few seconds; the agent runs
later). `url_verification` is answered with its `challenge`. Platform-native events
(docs/events.md): `im.message.recalled_v1`, `im.message.reaction.created_v1` /
`deleted_v1` (`channels.feishu.reactions`) and `card.action.trigger` (`channels.feishu.native`).

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
from urllib.parse import quote

import structlog

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelRejected,
    ChannelRequestError,
    DeliveryError,
    InvalidPayload,
)
from app.events import (
    APPROVAL_KEY,
    DELETE_KEY,
    PRIVATE_NOTICE_KEY,
    FilePart,
    ImagePart,
    InboundEvent,
    OutboundMessage,
)
from app.streaming.protocol import StreamingMode
from channels.common.after_finish import AfterFinish
from channels.common.media import (
    Media,
    MediaTooLarge,
    answer_to,
    download_capped,
    inline_media,
    too_large_text,
)
from channels.feishu import crypto
from channels.feishu.api import FeishuApi
from channels.feishu.card import FeishuCardStreamer
from channels.feishu.native import (
    CARD_ACTION,
    CARD_PRESS_KEY,
    CARD_WAIT_SECONDS,
    ApprovalCards,
    parse_card_action,
)
from channels.feishu.outbound import FeishuOutbound
from channels.feishu.parse import (
    MESSAGE_RECALLED,
    MESSAGE_RECEIVED,
    Parsed,
    parse_message_event,
    parse_recall,
)
from channels.feishu.reactions import (
    REACTION_CREATED,
    REACTION_DELETED,
    LookupFailed,
    MessageLocator,
    parse_reaction,
    reaction_event,
)
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
        # The API calls every sender shares: replies here, previews in the streamers.
        self.outbound = FeishuOutbound(self.api, settings)
        self.locator = MessageLocator(self.api, settings, context.records)  # reactions' messages
        self.cards = ApprovalCards(self.outbound, settings, self.locator)  # prompts with buttons

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

    # --- roles ----------------------------------------------------------------------

    async def chat_roles(self, chat_id: str) -> dict[str, str]:
        """The group's owner and managers by open_id (`app.access.roles` caches them):
        events carry no role, so the chat's information is asked (im/v1/chats/:chat_id)."""
        if not self.settings.app_id or not self.settings.app_secret:
            return {}
        answer = await self.api.get(f"/open-apis/im/v1/chats/{quote(chat_id, safe='')}?user_id_type=open_id")
        data = answer.get("data") or {}
        roles = {str(m): "admin" for m in data.get("user_manager_id_list") or [] if isinstance(m, str)}
        if isinstance(data.get("owner_id"), str) and data.get("owner_id_type", "open_id") == "open_id":
            roles[data["owner_id"]] = "owner"
        return roles

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
        if kind == CARD_ACTION:  # a press on an approval card's button (docs/events.md)
            return await self._card_action(payload)
        if kind in (REACTION_CREATED, REACTION_DELETED):
            return await self._reaction(payload)
        if kind not in (MESSAGE_RECEIVED, MESSAGE_RECALLED):
            return ChannelResponse.json({"ok": True, "ignored": f"event type {kind}"})
        if kind == MESSAGE_RECALLED:  # docs/events.md
            parsed = parse_recall(payload, self.settings)
        else:
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

    async def _card_action(self, payload: dict[str, Any]) -> ChannelResponse:
        """Accept the press, then wait (within Feishu's 3 s) for a refusal to show as a toast.

        The answer to a card callback is what Feishu shows the presser: `{}` shows nothing, a
        `toast` is seen by them alone. What the press decided reaches the chat as a reply."""
        started = time.monotonic()
        parsed = parse_card_action(payload, self.settings)
        if parsed.event is None:
            return ChannelResponse.json({})
        [result] = await self.context.accept([parsed.event])
        left = CARD_WAIT_SECONDS - (time.monotonic() - started)
        if result.duplicate or result.skipped or left <= 0:
            return ChannelResponse.json({})
        waited = await self.context.wait_for_replies(result.event_id, left)
        refusal = next((r.text for r in waited.replies if r.private and r.text), None)
        if refusal is None:
            return ChannelResponse.json({})
        return ChannelResponse.json({"toast": {"type": "error", "content": refusal}})

    async def _reaction(self, payload: dict[str, Any]) -> ChannelResponse:
        """A reaction, to the session of the message it is on (`channels.feishu.reactions`)."""
        reaction = parse_reaction(payload)
        if reaction is None or reaction.open_id == self.bot_open_id:
            return ChannelResponse.json({"ok": True, "ignored": "a reaction by an app"})
        try:
            where = await self.locator.locate(reaction.message_id)
        except LookupFailed as exc:  # nothing stored: Feishu sends the event again later
            return ChannelResponse.json({"error": "unavailable", "detail": f"message lookup: {exc}"}, 503)
        if where is None:
            return ChannelResponse.json(
                {"ok": True, "ignored": "a reaction on a message Feishu does not show"}
            )
        [result] = await self.context.accept([reaction_event(reaction, where, self.settings)])
        body = {"ok": True, "event_id": result.event_id, "session_key": result.session_key}
        return ChannelResponse.json({**body, "duplicate": True} if result.duplicate else body)

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
        if DELETE_KEY in message.metadata:  # our answer to a recalled message (docs/events.md)
            try:
                await self.api.delete(f"/open-apis/im/v1/messages/{quote(str(message.metadata[DELETE_KEY]))}")
            except ChannelRejected as exc:  # already recalled, or too old: nothing to retry
                log.info("feishu_delete_refused", detail=exc.detail)
            return SendResult()
        if message.metadata.get(PRIVATE_NOTICE_KEY) and message.metadata.get(CARD_PRESS_KEY):
            # A refused press: shown as the callback's toast when decided within its 3 s
            # (`_card_action`); Feishu has no later private answer to a card callback.
            # (A refused typed `/approve` is an ordinary reply.)
            log.info("feishu_private_notice_not_sent", text=message.text[:200])
            return SendResult()
        if APPROVAL_KEY in message.metadata and message.text:
            return await self.cards.send(message)
        return await self.outbound.send(message)

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
            return await download_capped(
                self.context.fetcher, part.url, limit, headers=headers, trusted=[prefix]
            )

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
                await self.outbound.post_message(reply, "text", text)
            except DeliveryError as exc:  # best-effort: nothing is stored either way
                log.warning("feishu_too_large_reply_failed", error=exc.detail)
            return None

    # --- streaming (`app.streaming`) ------------------------------------------------------

    def streamer(self) -> AfterFinish | None:
        s = self.settings
        if not s.app_id or not s.app_secret or s.streaming is StreamingMode.OFF:
            return None
        text = FeishuStreamer(self.outbound, s)
        inner = FeishuCardStreamer(self.outbound, s, text) if s.streaming is StreamingMode.NATIVE else text
        return AfterFinish(inner, self.cards.after_preview)
