"""Telegram Bot API channel: webhook (production) or long polling (development).

Inbound: `POST /channels/telegram`; the `X-Telegram-Bot-Api-Secret-Token` header is
checked in constant time before the body is parsed. Updates become events (dedup on
`update_id`) and are committed to the inbox before Telegram gets its 200.
Outbound: `sendMessage` through python-telegram-bot's `Bot`, pointed at
`TELEGRAM_API_BASE_URL`; long texts are split, replies go to the message's forum topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from typing import Any

import structlog
from telegram import Bot
from telegram.constants import ChatMemberStatus
from telegram.error import (
    Conflict,
    TelegramError,
)
from telegram.request import HTTPXRequest

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, ConnectionConflicts, SendResult
from app.connections import HeldConnection, fingerprint
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelRequestError,
    ChannelSendAuthError,
    DeliveryError,
)
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming.protocol import Streamer, StreamingMode
from channels.common.after_finish import AfterFinish
from channels.common.media import Media, MediaTooLarge, download_capped, inline_media, too_large_text
from channels.telegram.drafts import TelegramDraftStreamer
from channels.telegram.members import ALLOWED_UPDATES
from channels.telegram.native_outbound import TelegramNativeOutbound
from channels.telegram.outbound import TelegramOutbound, chat_id_of, thread_of
from channels.telegram.parse import CHANNEL, FILE_URL_PREFIX, BotIdentity, Parsed, parse_update
from channels.telegram.settings import TelegramSettings
from channels.telegram.stream import TelegramStreamer

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
        self._polling = False  # this replica runs the long poll (holds the connection)
        self._conflicts = 0  # getUpdates answered 409 this many times in a row
        self._poller: HeldConnection | None = None
        self._connection = ""  # the polling connection's lease name
        # The Bot API calls every sender shares: replies here, previews in the streamers.
        self.outbound = TelegramOutbound(self.bot, settings) if self.bot is not None else None

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
            name = self._connection = f"telegram:{fingerprint(self.bot.token)}"
            self._poller = HeldConnection(self.context.hold_connection, name, self._poll_loop)

    async def stop(self) -> None:
        if self._poller is not None:
            await self._poller.release()
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
        result, *_ = await self.context.accept([event, *parsed.more])
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
        before downloading), then the bytes, under the limit, through the guarded fetcher
        (the configured file base is trusted; decoded bytes are counted while decoding)."""
        assert self.bot is not None
        if not (part.url or "").startswith(FILE_URL_PREFIX):
            return None
        limit = self.settings.media_max_bytes
        tg_file = await self.bot.get_file((part.url or "")[len(FILE_URL_PREFIX) :])
        if tg_file.file_size is not None and tg_file.file_size > limit:
            raise MediaTooLarge(limit)
        url = tg_file.file_path or ""
        if url.startswith(("http://", "https://")):
            return await download_capped(self.context.fetcher, url, limit, trusted=[self.bot.base_file_url])
        data = bytes(await tg_file.download_as_bytearray())  # a local Bot API server's own file path
        if len(data) > limit:
            raise MediaTooLarge(limit)
        return Media(data)

    async def _too_large(self, event: InboundEvent, limit: int) -> None:
        assert self.bot is not None
        text = too_large_text(self.settings.locale, limit)
        try:
            assert self.outbound is not None  # events are parsed only with a bot
            await self.outbound.send_text(chat_id_of(event.chat_id), text, thread_of(event.thread_id), None)
        except DeliveryError as exc:  # best-effort: the platform already has our 200
            log.warning("telegram_too_large_reply_failed", error=exc.detail)

    # --- inbound: long polling (development) ----------------------------------------

    async def _poll_loop(self) -> None:
        """Long polling while this replica holds the connection, from the committed offset.

        Each `getUpdates` is sent only after the hold was confirmed (fenced) and its
        long-poll timeout ends before the hold could pass to another replica; a hand-over
        ends the loop after the poll in flight, so two replicas never poll at once (Telegram
        answers that with 409, and keeps a long poll open after its client went away). The
        offset of what reached the inbox is saved with the hold for the next holder.
        """
        self._polling, self._conflicts = True, 0
        try:
            await self._poll()
        finally:
            self._polling = False

    def connection_conflicts(self) -> ConnectionConflicts | None:
        """`getUpdates` refused as a conflict, in a row (`app.alerts`: a 409 loop)."""
        if not self._polling:
            return None
        return ConnectionConflicts(self._conflicts, (self.poll_error or "") if self._conflicts else "")

    async def _poll(self) -> None:
        assert self.bot is not None
        states = self.context.connection_state
        saved = await states.load_state(self._connection)
        offset: int | None = saved.get("offset") if saved else None
        committed = offset
        while True:
            if offset != committed and await states.save_state(self._connection, {"offset": offset}):
                committed = offset
            certain_for = await states.confirm(self._connection)
            if certain_for <= 0:
                return  # lost, or handing over: no more polls from this replica
            try:
                updates = await self.bot.get_updates(
                    offset=offset,
                    timeout=int(min(float(self.settings.polling_timeout_seconds), certain_for / 2)),
                    allowed_updates=ALLOWED_UPDATES,
                )
            except asyncio.CancelledError:
                raise
            except Conflict as exc:
                self.poll_error = (
                    f"getUpdates answered 409 Conflict: {exc.message}. Another process is polling "
                    "with this token, or a webhook is set (delete it, or use TELEGRAM_MODE=webhook)."
                )
                self._conflicts += 1
                log.error("telegram_poll_conflict", detail=self.poll_error, in_a_row=self._conflicts)
                await asyncio.sleep(self.settings.polling_retry_seconds)
                continue
            except TelegramError as exc:
                self._conflicts = 0  # another failure: not (or no longer) a conflict
                self.poll_error = f"getUpdates failed: {exc.message}"
                log.warning("telegram_poll_failed", error=exc.message)
                await asyncio.sleep(self.settings.polling_retry_seconds)
                continue
            self.poll_error, self._conflicts = None, 0
            for update in updates:
                try:
                    parsed = await self._parse(update.to_dict())
                    event = await self._with_media(parsed.event) if parsed.event is not None else None
                    if event is not None:
                        await self.context.accept([event, *parsed.more])
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

    # --- roles ----------------------------------------------------------------------

    async def chat_roles(self, chat_id: str) -> dict[str, str]:
        """The group's administrators as roles (`app.access.roles` caches the answer):
        updates carry no role, so the Bot API is asked (getChatAdministrators)."""
        if self.bot is None:
            return {}
        admins = await self.bot.get_chat_administrators(chat_id_of(chat_id))
        return {
            str(member.user.id): "owner" if member.status == ChatMemberStatus.OWNER else "admin"
            for member in admins
        }

    # --- outbound -------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        if self.outbound is None or self.bot is None:
            raise ChannelSendAuthError("TELEGRAM_BOT_TOKEN is not set", retryable=False)
        # Platform-native events (docs/events.md): deletions, button presses, prompts.
        native = TelegramNativeOutbound(self.bot, self.settings.locale)
        if await native.before_send(message):
            return SendResult()
        result = await self.outbound.send(message)
        await native.after_send(message, result)
        return result

    # --- streaming (`app.streaming`) --------------------------------------------------

    def streamer(self) -> Streamer | None:
        if self.bot is None or self.outbound is None or self.settings.streaming is StreamingMode.OFF:
            return None
        # An approval prompt that ends a preview gets its buttons too (docs/events.md).
        native = TelegramNativeOutbound(self.bot, self.settings.locale)
        edits = AfterFinish(TelegramStreamer(self.outbound, self.settings), native.after_send)
        if self.settings.streaming is StreamingMode.NATIVE:  # drafts; edit previews in groups
            return TelegramDraftStreamer(self, self.bot, edits)
        return edits


def _from_group(data: Any) -> bool:
    message = data.get("message") if isinstance(data, dict) else None
    chat = message.get("chat") if isinstance(message, dict) else None
    return isinstance(chat, dict) and chat.get("type") in ("group", "supergroup")
