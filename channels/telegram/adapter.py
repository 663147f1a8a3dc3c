"""Telegram Bot API channel: webhook (production) or long polling (development).

Inbound: `POST /channels/telegram`; the `X-Telegram-Bot-Api-Secret-Token` header is
checked in constant time before the body is parsed. Updates become events (dedup on
`update_id`) and are committed to the inbox before Telegram gets its 200.
Outbound: `sendMessage` through python-telegram-bot's `Bot`, pointed at
`TELEGRAM_API_BASE_URL`; long texts are split, replies go to the message's forum topic.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import time
from typing import Any

import structlog
from telegram import Bot, InputFile, ReplyParameters
from telegram.constants import ChatAction
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    TelegramError,
)
from telegram.request import HTTPXRequest

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.connections import fingerprint
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelRejected,
    ChannelRequestError,
    ChannelSendAuthError,
    DeliveryError,
)
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage, TextPart
from app.streaming import Streamer, StreamingMode
from channels.common.chunks import ChunkProgress, send_chunks
from channels.common.media import Media, MediaTooLarge, inline_media, too_large_text
from channels.telegram.drafts import TelegramDraftStreamer
from channels.telegram.errors import telegram_errors
from channels.telegram.parse import CHANNEL, FILE_URL_PREFIX, BotIdentity, Parsed, parse_update
from channels.telegram.settings import TelegramSettings
from channels.telegram.text import split_text

log = structlog.get_logger(__name__)

SECRET_HEADER = "x-telegram-bot-api-secret-token"
IDENTITY_RETRY_SECONDS = 30.0


def build_bot(settings: TelegramSettings) -> Bot:
    """A PTB `Bot` for these settings (base URLs and timeouts included)."""
    if not settings.bot_token:
        raise ChannelNotConfigured("TELEGRAM_BOT_TOKEN is not set")
    timeout = settings.request_timeout_seconds
    return Bot(
        settings.bot_token,
        base_url=settings.api_base_url,
        base_file_url=settings.file_base_url,
        request=HTTPXRequest(connection_pool_size=8, read_timeout=timeout, connect_timeout=timeout),
        # getUpdates adds its long-poll timeout to this read timeout.
        get_updates_request=HTTPXRequest(read_timeout=timeout, connect_timeout=timeout),
    )


class TelegramChannel:
    name = "telegram"

    def __init__(self, settings: TelegramSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.bot: Bot | None = build_bot(settings) if settings.bot_token else None
        self.identity = BotIdentity(settings.bot_id, settings.bot_username)
        self._identity_tried_at = -IDENTITY_RETRY_SECONDS
        self.poll_error: str | None = None  # the last getUpdates failure, for operators and tests
        self._poller: asyncio.Future[None] | None = None
        self._progress = ChunkProgress(capacity=1000)  # chunks already delivered, per message

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self.bot is None:
            log.warning("telegram_not_configured", detail="TELEGRAM_BOT_TOKEN is not set")
            return
        try:
            await self.bot.initialize()  # opens the HTTP clients, then getMe
        except TelegramError as exc:
            # Not fatal for the service: the webhook still answers private chats, and the
            # identity is asked for again with the next update.
            log.error("telegram_get_me_failed", error=str(exc))
            self._identity_tried_at = time.monotonic()
        else:
            me = self.bot.bot
            self.identity = BotIdentity(
                self.settings.bot_id or me.id, self.settings.bot_username or me.username
            )
        if self.settings.mode == "polling":
            # One poller per token across every replica (a second one gets 409 Conflict).
            name = f"telegram:{fingerprint(self.bot.token)}"
            self._poller = asyncio.ensure_future(self.context.hold_connection(name, self._poll_loop))

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self.bot is not None:
            with contextlib.suppress(Exception):
                await self.bot.shutdown()

    async def _ensure_identity(self) -> None:
        """Learn the bot's id and @username (needed for mention gating) once, via getMe."""
        if self.bot is None or (self.identity.id is not None and self.identity.username):
            return
        now = time.monotonic()
        if now - self._identity_tried_at < IDENTITY_RETRY_SECONDS:
            return  # Telegram was unreachable a moment ago; do not slow every update down
        self._identity_tried_at = now
        try:
            me = await self.bot.get_me()
        except TelegramError as exc:
            log.error("telegram_get_me_failed", error=str(exc))
            return
        self.identity = BotIdentity(self.settings.bot_id or me.id, self.settings.bot_username or me.username)

    # --- inbound: webhook -------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path not in ("", "/"):
            return ChannelResponse.json({"error": "not_found", "detail": "POST /channels/telegram"}, 404)
        secret = self.settings.webhook_secret
        if not secret:
            raise ChannelNotConfigured("TELEGRAM_WEBHOOK_SECRET is not set on this server")
        given = request.headers.get(SECRET_HEADER)
        if given is None:
            raise ChannelAuthError("missing X-Telegram-Bot-Api-Secret-Token header")
        if not hmac.compare_digest(given.encode(), secret.encode()):
            raise ChannelAuthError("X-Telegram-Bot-Api-Secret-Token does not match")
        parsed = await self._parse(request.json())
        body: dict[str, Any] = {"ok": True, "update_id": parsed.update_id}
        if parsed.event is None:
            body["ignored"] = parsed.ignored
            return ChannelResponse.json(body)
        event = await self._with_media(parsed.event)
        if event is None:
            body["ignored"] = "media too large"
            return ChannelResponse.json(body)
        [result] = await self.context.accept([event])
        body.update(event_id=result.event_id, session_key=result.session_key)
        if result.duplicate:
            body["duplicate"] = True
        if result.skipped:
            body["skipped"] = True
        return ChannelResponse.json(body)

    async def _parse(self, data: Any) -> Parsed:
        if (self.identity.id is None or not self.identity.username) and _from_group(data):
            await self._ensure_identity()  # getMe failed at start; mention gating needs it
        return parse_update(data, self.bot, self.settings, self.identity)

    # --- inbound: media ------------------------------------------------------------

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """The event with its images downloaded (getFile) as data the model can see, its
        voice notes transcribed when speech to text is on (`STT_MODEL`), and its documents
        downloaded when the gateway keeps received files (`ChannelContext.keeps_files`),
        through the shared `channels.common.media`.

        A file over `TELEGRAM_MEDIA_MAX_BYTES` gets a polite reply and the event is not
        stored (None). A download or transcription that fails leaves the file reference in
        place (the model is told a file was sent) rather than losing the message.
        """
        if self.bot is None:
            return event
        try:
            return await inline_media(
                event,
                self._fetch,
                transcribe=self.context.transcribe,
                channel=CHANNEL,
                files=self.context.keeps_files,
            )
        except MediaTooLarge as exc:
            await self._too_large(event, exc.limit)
            return None

    async def _fetch(self, part: ImagePart | FilePart) -> Media | None:
        """One file by its `telegram-file:` reference: getFile (its `file_size` checked
        before downloading), then the bytes, under the limit."""
        assert self.bot is not None
        if not (part.url or "").startswith(FILE_URL_PREFIX):
            return None
        limit = self.settings.media_max_bytes
        tg_file = await self.bot.get_file((part.url or "")[len(FILE_URL_PREFIX) :])
        if tg_file.file_size is not None and tg_file.file_size > limit:
            raise MediaTooLarge(limit)
        data = bytes(await tg_file.download_as_bytearray())
        if len(data) > limit:
            raise MediaTooLarge(limit)
        return Media(data)

    async def _too_large(self, event: InboundEvent, limit: int) -> None:
        assert self.bot is not None
        text = too_large_text(self.settings.locale, limit)
        try:
            await self._send_chunk(_chat_id(event.chat_id), text, _thread_of(event.thread_id), None)
        except DeliveryError as exc:  # best-effort: the platform already has our 200
            log.warning("telegram_too_large_reply_failed", error=exc.detail)

    # --- inbound: long polling (development) ----------------------------------------

    async def _poll_loop(self) -> None:
        assert self.bot is not None
        offset: int | None = None
        while True:
            try:
                updates = await self.bot.get_updates(
                    offset=offset,
                    timeout=self.settings.polling_timeout_seconds,
                    allowed_updates=["message"],
                )
            except asyncio.CancelledError:
                raise
            except Conflict as exc:
                self.poll_error = (
                    f"getUpdates answered 409 Conflict: {exc.message}. Another process is polling "
                    "with this token, or a webhook is set (delete it, or use TELEGRAM_MODE=webhook)."
                )
                log.error("telegram_poll_conflict", detail=self.poll_error)
                await asyncio.sleep(self.settings.polling_retry_seconds)
                continue
            except TelegramError as exc:
                self.poll_error = f"getUpdates failed: {exc.message}"
                log.warning("telegram_poll_failed", error=exc.message)
                await asyncio.sleep(self.settings.polling_retry_seconds)
                continue
            self.poll_error = None
            for update in updates:
                try:
                    parsed = await self._parse(update.to_dict())
                    event = await self._with_media(parsed.event) if parsed.event is not None else None
                    if event is not None:
                        await self.context.accept([event])
                except asyncio.CancelledError:
                    raise
                except ChannelRequestError as exc:  # an update we cannot use: skip, do not loop on it
                    log.warning("telegram_update_refused", update_id=update.update_id, detail=exc.detail)
                except Exception:
                    # Not confirmed: the next getUpdates returns it again (dedup makes that safe).
                    log.exception("telegram_poll_accept_failed", update_id=update.update_id)
                    await asyncio.sleep(self.settings.polling_retry_seconds)
                    break
                # Confirmed only after the inbox commit: nothing is lost if we die here.
                offset = update.update_id + 1

    # --- outbound -------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        if self.bot is None:
            raise ChannelSendAuthError("TELEGRAM_BOT_TOKEN is not set", retryable=False)
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = [p for p in message.parts if isinstance(p, (ImagePart, FilePart)) and _uploadable(p)]
        if not chunks and not media:
            return SendResult()
        chat_id: int | str = _chat_id(message.chat_id)
        thread_id = int(message.thread_id) if message.thread_id and message.thread_id.isdigit() else None
        quote = message.metadata.get("reply_msg_id")

        async def deliver(index: int, chunk: str) -> int:
            reply = (
                ReplyParameters(message_id=int(quote), allow_sending_without_reply=True)
                if quote is not None and index == 0
                else None
            )
            if index >= len(chunks):  # the text first, then each image or file
                return await self._send_media(chat_id, media[index - len(chunks)], thread_id, reply)
            return await self._send_chunk(chat_id, chunk, thread_id, reply)

        items = [*chunks, *(f"media:{i}" for i in range(len(media)))]
        sent = await send_chunks(self._progress, message.message_id, items, deliver)
        return SendResult(platform_message_id=str(sent[0]) if sent else None)

    async def _send_chunk(
        self, chat_id: int | str, text: str, thread_id: int | None, reply: ReplyParameters | None
    ) -> int:
        assert self.bot is not None
        with telegram_errors():
            try:
                sent = await self.bot.send_message(
                    chat_id=chat_id, text=text, message_thread_id=thread_id, reply_parameters=reply
                )
            except ChatMigrated as exc:  # the group became a supergroup: same chat, new id
                sent = await self.bot.send_message(
                    chat_id=exc.new_chat_id, text=text, message_thread_id=thread_id, reply_parameters=reply
                )
        return sent.message_id

    async def _send_media(
        self,
        chat_id: int | str,
        part: ImagePart | FilePart,
        thread_id: int | None,
        reply: ReplyParameters | None,
    ) -> int:
        """`sendPhoto` for an image, `sendDocument` for a file: the bytes uploaded, or the URL."""
        assert self.bot is not None
        content: Any
        if part.data_base64:
            name = getattr(part, "name", None) or ("image" if isinstance(part, ImagePart) else "file")
            content = InputFile(base64.b64decode(part.data_base64), filename=name)
        else:
            content = part.url
        with telegram_errors():
            if isinstance(part, ImagePart):
                sent = await self.bot.send_photo(
                    chat_id=chat_id, photo=content, message_thread_id=thread_id, reply_parameters=reply
                )
            else:
                sent = await self.bot.send_document(
                    chat_id=chat_id, document=content, message_thread_id=thread_id, reply_parameters=reply
                )
        return sent.message_id

    # --- streaming (`app.streaming`) --------------------------------------------------

    def streamer(self) -> Streamer | None:
        if self.bot is None or self.settings.streaming is StreamingMode.OFF:
            return None
        if self.settings.streaming is StreamingMode.NATIVE:  # drafts; edit previews in groups
            return TelegramDraftStreamer(self, self.bot, TelegramStreamer(self))
        return TelegramStreamer(self)


class TelegramStreamer:
    """Previews as `sendMessage` + `editMessageText`, typing as `sendChatAction`.

    Telegram allows about one message per second per chat (`TELEGRAM_STREAM_EDIT_SECONDS`).
    """

    def __init__(self, channel: TelegramChannel) -> None:
        assert channel.bot is not None
        self.channel = channel
        self.bot = channel.bot
        self.edit_interval = channel.settings.stream_edit_seconds
        self.max_preview_chars = channel.settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        with telegram_errors():
            await self.bot.send_chat_action(
                chat_id=_chat_id(message.chat_id),
                action=ChatAction.TYPING,
                message_thread_id=_thread(message),
            )

    async def open(self, message: OutboundMessage) -> str:
        reply = _quote(message)
        sent = await self.channel._send_chunk(
            _chat_id(message.chat_id), message.text, _thread(message), reply
        )
        return str(sent)

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        with telegram_errors():
            try:
                await self.bot.edit_message_text(
                    message.text, chat_id=_chat_id(message.chat_id), message_id=int(preview_id)
                )
            except BadRequest as exc:
                if "not modified" not in exc.message.lower():
                    raise

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = split_text(message.text, self.channel.settings.max_message_chars)
        media = [p for p in message.parts if isinstance(p, (ImagePart, FilePart)) and _uploadable(p)]
        chat_id, thread_id = _chat_id(message.chat_id), _thread(message)

        async def deliver(index: int, chunk: str) -> int:
            if index >= len(chunks):
                return await self.channel._send_media(chat_id, media[index - len(chunks)], thread_id, None)
            if index > 0:
                return await self.channel._send_chunk(chat_id, chunk, thread_id, None)
            try:
                await self.edit(message.model_copy(update={"parts": (TextPart(text=chunk),)}), preview_id)
            except ChannelRejected as exc:
                if "not found" not in exc.detail.lower():
                    raise
                # The preview was deleted: the answer replaces it as a new message.
                return await self.channel._send_chunk(chat_id, chunk, thread_id, _quote(message))
            return int(preview_id)

        items = [*chunks, *(f"media:{i}" for i in range(len(media)))]
        sent = await send_chunks(self.channel._progress, message.message_id, items, deliver)
        return SendResult(platform_message_id=str(sent[0]) if sent else preview_id)


def _uploadable(part: ImagePart | FilePart) -> bool:
    """Bytes we hold, or a URL Telegram can fetch (never a platform reference)."""
    return bool(part.data_base64) or (part.url or "").startswith(("http://", "https://"))


def _thread_of(thread_id: str | None) -> int | None:
    return int(thread_id) if thread_id and thread_id.isdigit() else None


def _thread(message: OutboundMessage) -> int | None:
    return _thread_of(message.thread_id)


def _quote(message: OutboundMessage) -> ReplyParameters | None:
    quote = message.metadata.get("reply_msg_id")
    return (
        ReplyParameters(message_id=int(quote), allow_sending_without_reply=True)
        if quote is not None
        else None
    )


def _from_group(data: Any) -> bool:
    message = data.get("message") if isinstance(data, dict) else None
    chat = message.get("chat") if isinstance(message, dict) else None
    return isinstance(chat, dict) and chat.get("type") in ("group", "supergroup")


def _chat_id(value: str) -> int | str:
    """Numeric ids go as integers; `@channelusername` stays a string."""
    try:
        return int(value)
    except ValueError:
        return value
