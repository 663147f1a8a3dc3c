"""LINE Messaging API over its webhook (`POST /channels/line`).

Inbound: `X-Line-Signature` is checked over the raw body before anything else (401,
nothing stored); message events become `InboundEvent`s (`channels.line.parse`), images,
and with speech to text or kept files also audio, video and files, are downloaded from
the content API by message id under `LINE_MEDIA_MAX_BYTES`; `unsend`, `postback`,
`memberJoined` and `memberLeft` become platform-native events (`channels.line.native`,
docs/events.md); every event of the request is committed to the inbox before the 200.

Outbound: an answer uses the event's reply token while it is valid (single use, free,
about a minute after the event), and push messages after that or when LINE refuses the
token; text is split at 5,000 characters and sent at most five messages per request.
Pushes carry an `X-Line-Retry-Key` derived from the outbound id and the batch, so an
outbox retry after a lost answer is not delivered twice. While a turn runs in a
one-to-one chat, LINE's loading animation shows (`native` streaming). An approval prompt
is followed by a confirm template with Approve / Deny postback buttons.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import structlog

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.errors import ChannelNotConfigured, DeliveryError, InvalidPayload, PreviewUnavailable
from app.events import (
    APPROVAL_KEY,
    PRIVATE_NOTICE_KEY,
    FilePart,
    ImagePart,
    InboundEvent,
    NativeKind,
    OutboundMessage,
    native_of,
)
from app.streaming.protocol import StreamingMode
from channels.common.chunks import split_text
from channels.common.media import (
    Media,
    MediaTooLarge,
    download_capped,
    inline_media,
    tell_too_large,
)
from channels.line import signing
from channels.line.api import (
    AlreadyAccepted,
    Confirm,
    Image,
    InvalidReplyToken,
    Item,
    LineApi,
    retry_key,
)
from channels.line.native import PRESSER_KEY, approval_labels, approval_text, with_name
from channels.line.parse import parse_events, quoted_in_group
from channels.line.settings import LineSettings

log = structlog.get_logger(__name__)

MAX_MESSAGES_PER_REQUEST = 5  # LINE: at most five message objects in one reply or push
_KEPT = 10_000
SENT_KIND = "sent"  # channel record per group/room: the bot's recent message ids
REMEMBERED_PER_GROUP = 50
_UNSENT_MEDIA = {
    "en": "(A file could not be sent here: LINE only takes media from a public https address.)",
    "zh": "（有文件无法在此发送：LINE 只接受公开 https 地址上的媒体。）",
}


def _utf16_len(text: str) -> int:
    """LINE counts a text message's 5,000 characters in UTF-16 code units (emoji are two)."""
    return len(text.encode("utf-16-le")) // 2


class LineChannel:
    name = "line"

    def __init__(self, settings: LineSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.api = LineApi(settings)
        # Reply tokens this process used (single use: a second answer to one event pushes).
        self._used_tokens: OrderedDict[str, None] = OrderedDict()
        # Batches of an outbound message already delivered, so a retry sends only the rest.
        self._delivered: OrderedDict[tuple[str, int], str | None] = OrderedDict()
        self._loading_until: dict[str, float] = {}  # user → when the shown animation ends

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.api.close()

    # --- inbound -----------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path.strip("/") != "":
            return ChannelResponse.json({"error": "not_found", "detail": "POST /channels/line"}, 404)
        if not self.settings.channel_secret:
            raise ChannelNotConfigured("LINE_CHANNEL_SECRET must be set on this server")
        signing.verify(
            self.settings.channel_secret, request.body, request.headers.get(signing.SIGNATURE_HEADER)
        )
        payload = request.json()
        if not isinstance(payload, dict) or not isinstance(payload.get("events"), list):
            raise InvalidPayload("body must be a JSON object with an events list")
        events: list[InboundEvent] = []
        for raw in payload["events"]:  # all parsed before any is stored: bad input stores nothing
            events.extend(parse_events(raw, self.settings, await self._bot_messages(raw)))
        events = [await self._named(e) for e in events]
        ready = [e for e in [await self._with_media(e) for e in events] if e is not None]
        if ready:
            await self.context.accept(ready)
        # An empty events list is the console's "Verify" button: a signed 200 is the answer.
        return ChannelResponse.json({})

    async def _named(self, event: InboundEvent) -> InboundEvent:
        """A joining member's display name for the welcome (best-effort: the user id stays
        when LINE does not answer within `LINE_API_TIMEOUT_SECONDS`)."""
        native = native_of(event)
        if native is None or native.kind is not NativeKind.JOINED or not self.settings.welcome_text:
            return event
        try:
            name = await self.api.member_name(event.chat_id, event.sender_id)
        except DeliveryError as exc:
            log.info("line_member_name_unknown", error=str(exc))
            return event
        return with_name(event, name) if name else event

    async def _bot_messages(self, raw: object) -> frozenset[str]:
        """The bot's recent message ids in the group a message quotes from (a quote of the
        bot's own message addresses it, like an @-mention)."""
        quoting = quoted_in_group(raw)
        if quoting is None or self.context.records is None or not self.settings.require_mention_in_groups:
            return frozenset()
        record = await self.context.records.get(SENT_KIND, quoting[0])
        ids = record.data.get("ids") if record is not None else None
        return frozenset(str(i) for i in ids) if isinstance(ids, list) else frozenset()

    async def _remember_sent(self, chat_id: str, ids: list[str]) -> None:
        """Keep the bot's last message ids per group/room, for quotes of them (best-effort:
        two replicas answering one group at once may drop a few)."""
        if not ids or self.context.records is None or chat_id.startswith("U"):
            return
        try:
            record = await self.context.records.get(SENT_KIND, chat_id)
            kept = record.data.get("ids") if record is not None else None
            recent = [*(kept if isinstance(kept, list) else []), *ids][-REMEMBERED_PER_GROUP:]
            await self.context.records.put(SENT_KIND, chat_id, {"ids": recent}, open=False)
        except Exception as exc:  # a convenience only: the answer itself went out
            log.warning("line_sent_ids_not_kept", error=str(exc) or repr(exc))

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """Media by message id from the content API; over the cap a polite reply, None stored."""
        limit = self.settings.media_max_bytes
        headers = {"Authorization": f"Bearer {self.settings.channel_access_token or ''}"}

        async def fetch(part: ImagePart | FilePart) -> Media | None:
            if not part.url:
                return None
            # The content API's base is the operator's setting: trusted by the guarded fetcher.
            return await download_capped(
                self.context.fetcher,
                part.url,
                limit,
                headers=headers,
                trusted=(self.settings.data_api_base_url,),
            )

        try:
            return await inline_media(
                event,
                fetch,
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,
            )
        except MediaTooLarge as exc:
            await tell_too_large(self.send, event, self.settings.locale, exc.limit)
            return None

    # --- outbound ----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        if not message.chat_id:
            raise InvalidPayload("a LINE answer needs a chat id")
        items: list[Item] = [
            t for t in split_text(message.text, self.settings.max_text_chars, units=_utf16_len) if t.strip()
        ]
        links: list[str] = []
        unsent = 0
        for part in message.parts:
            if isinstance(part, ImagePart) and part.url and part.url.startswith("https://"):
                items.append(Image(part.url))  # LINE fetches images from public https URLs
            elif isinstance(part, ImagePart | FilePart) and part.url:
                links.append(part.url)  # no file messages for bots: a link always works
            elif isinstance(part, ImagePart | FilePart) and part.data_base64:
                # LINE has no upload for bot messages: media must be at a public https URL.
                unsent += 1
        if links:
            items.append("\n".join(links))
        if unsent:
            log.warning("line_media_without_url_not_sent", outbound=message.message_id, count=unsent)
            items.append(_UNSENT_MEDIA[self.settings.locale])
        if APPROVAL_KEY in message.metadata:  # approve / deny buttons under the prompt
            items.append(self._approval_buttons(str(message.metadata[APPROVAL_KEY])))
        if not items:
            return SendResult()
        presser = message.metadata.get(PRESSER_KEY)
        private = message.metadata.get(PRIVATE_NOTICE_KEY)
        if private and isinstance(presser, str) and presser and presser != message.chat_id:
            # For the presser only: a push to their one-to-one chat with the bot, not the
            # group (LINE delivers it only if they added the bot as a friend).
            message = message.model_copy(
                update={
                    "chat_id": presser,
                    "metadata": {k: v for k, v in message.metadata.items() if not k.startswith("reply_")},
                }
            )
        batches = [
            items[i : i + MAX_MESSAGES_PER_REQUEST] for i in range(0, len(items), MAX_MESSAGES_PER_REQUEST)
        ]
        sent: str | None = None
        for index, batch in enumerate(batches):
            done = (message.message_id, index)
            if done in self._delivered:
                sent = self._delivered[done]
                continue
            ids = await self._deliver(message, batch, index)
            await self._remember_sent(message.chat_id, ids)
            sent = ids[-1] if ids else sent
            self._delivered[done] = sent
            while len(self._delivered) > _KEPT:
                self._delivered.popitem(last=False)
        self._loading_until.pop(message.chat_id, None)  # a message ends the animation
        return SendResult(platform_message_id=sent)

    def _approval_buttons(self, approval_id: str) -> Confirm:
        approve, deny = approval_labels(self.settings.locale)
        return Confirm(
            approval_text(approval_id, self.settings.locale),
            ((approve, f"approve:{approval_id}"), (deny, f"deny:{approval_id}")),
        )

    async def _deliver(self, message: OutboundMessage, items: list[Item], index: int) -> list[str]:
        token = self._fresh_token(message)
        if token is not None:
            quote = message.metadata.get("reply_quote_token")
            try:
                ids = await self.api.reply(token, items, quote if isinstance(quote, str) else None)
            except InvalidReplyToken as exc:  # used elsewhere or expired early: push instead
                log.info("line_reply_token_refused", detail=exc.detail)
                self._spend(token)
            else:
                self._spend(token)
                return ids
            # Other failures (5xx, 429, network) keep the token: the outbox's retry tries it
            # again while it is fresh (free), and LINE refuses it if it was consumed after all.
        try:
            return await self.api.push(message.chat_id, items, retry_key(message.message_id, index))
        except AlreadyAccepted:
            log.info("line_push_already_accepted", outbound=message.message_id, batch=index)
            return []

    def _spend(self, token: str) -> None:
        self._used_tokens[token] = None
        while len(self._used_tokens) > _KEPT:
            self._used_tokens.popitem(last=False)

    def _fresh_token(self, message: OutboundMessage) -> str | None:
        token = message.metadata.get("reply_token")
        at = message.metadata.get("reply_token_at")
        if not isinstance(token, str) or not token or token in self._used_tokens:
            return None
        if not isinstance(at, int | float) or time.time() - at >= self.settings.reply_window_seconds:
            return None
        return token

    # --- loading animation (`native` streaming) -------------------------------------------

    async def loading(self, message: OutboundMessage) -> None:
        """LINE's loading animation, one-to-one chats only; renewed shortly before it ends."""
        if message.metadata.get("reply_source") != "user":
            return
        now = time.monotonic()
        if self._loading_until.get(message.chat_id, 0.0) - now > 5:
            return
        self._loading_until[message.chat_id] = now + self.settings.loading_seconds
        try:
            await self.api.show_loading(message.chat_id)
        except DeliveryError:
            self._loading_until.pop(message.chat_id, None)
            raise

    def streamer(self) -> LineLoading | None:
        if self.settings.streaming is StreamingMode.OFF:
            return None
        return LineLoading(self)


class LineLoading:
    """A `Streamer` with the loading animation only: LINE messages cannot be edited."""

    def __init__(self, channel: LineChannel) -> None:
        self.channel = channel
        self.edit_interval = 5.0
        self.max_preview_chars = channel.settings.max_text_chars

    async def typing(self, message: OutboundMessage) -> None:
        await self.channel.loading(message)

    async def open(self, message: OutboundMessage) -> str:
        raise PreviewUnavailable("LINE messages cannot be edited: no preview")

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        raise PreviewUnavailable("LINE messages cannot be edited: no preview")

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        return await self.channel.send(message)


__all__ = ["LineChannel", "LineLoading"]
