"""Personal WeChat through Tencent's iLink bot API: long-poll in, `sendmessage` out.

Inbound: one replica holds the account's connection (`weixin:<account>`, a connection
lease) and long-polls `getupdates` with the cursor (`get_updates_buf`) the previous
answer gave. The messages of an answer are committed to the inbox (dedup on the message
id) before the new cursor is saved in the lease row (fenced); a holder that dies in
between leaves the old cursor, the next holder is given the same messages again and the
inbox drops them. So a take-over loses nothing and answers nothing twice.

Each message's `context_token` is kept per peer in the channel's records: a reply must
carry the conversation's token, and the newest one is used (any replica may send).

Outbound: `sendmessage` with the peer's `context_token`, text split at 4,000 characters,
a stable `client_id` per message and chunk; images and files encrypted and uploaded to
the CDN (`channels.weixin.cdn`); WAV or SILK audio as a voice note (SILK, see
`channels.weixin.voice`). Typing (`native` streaming): `getconfig` gives a
per-user `typing_ticket`, `sendtyping` shows it while the turn runs.

Session expired (errcode -14): the login is marked expired in the records, logged, shown
by `chatgate doctor`; polling pauses (no spinning) until `chatgate channels weixin login`
stores a new token, which every replica picks up.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from typing import Any

import httpx
import structlog

from app.channel import ChannelContext, SendResult
from app.connections import HeldConnection, fingerprint
from app.errors import (
    ChannelRejected,
    ChannelRequestError,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
)
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming.protocol import StreamingMode
from channels.common.chunks import ChunkProgress, send_chunks, split_text
from channels.common.media import (
    Media,
    MediaTooLarge,
    inline_media,
    tell_too_large,
)
from channels.weixin import cdn, login, voice
from channels.weixin.api import (
    ITEM_FILE,
    ITEM_IMAGE,
    ITEM_TEXT,
    ITEM_VIDEO,
    ITEM_VOICE,
    MESSAGE_STATE_FINISH,
    MESSAGE_TYPE_BOT,
    TYPING,
    TYPING_CANCEL,
    UPLOAD_FILE,
    UPLOAD_IMAGE,
    UPLOAD_VIDEO,
    UPLOAD_VOICE,
    Identity,
    ILinkClient,
    ILinkError,
    SessionExpired,
)
from channels.weixin.parse import MediaRef, parse_message
from channels.weixin.settings import WeixinSettings
from channels.weixin.streaming import WeixinTyping
from channels.weixin.web_login import BackgroundLogin

log = structlog.get_logger(__name__)

PEER = "peer"  # records of each peer's newest context_token
TICKET_TTL_SECONDS = 3600.0
TICKET_RETRY_SECONDS = 60.0
MAX_FAILURES = 3
NOT_LOGGED_IN = "not logged in: run `chatgate channels weixin login`"
SESSION_EXPIRED = "session expired (errcode -14): run `chatgate channels weixin login`"


class WeixinChannel:
    name = "weixin"

    def __init__(self, settings: WeixinSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.connection = f"weixin:{settings.account}"
        self._http = httpx.AsyncClient(timeout=settings.request_timeout_seconds)
        identity = Identity(settings.app_id, settings.client_version, settings.bot_agent)
        self.client = ILinkClient(
            self._http,
            settings.api_base_url,
            settings.bot_token,
            identity,
            timeout=settings.request_timeout_seconds,
        )
        # Why the session is paused, while it is (the first poll reads the stored login).
        self.expired: str | None = None if settings.bot_token else NOT_LOGGED_IN
        self.poll_error: str | None = None  # the last getupdates failure, for operators and tests
        self.bot_id: str | None = None  # the logged-in bot (`ilink_bot_id`), when a login says
        self._stale: str | None = None  # the token iLink said expired: never used again
        self._holder: HeldConnection | None = None
        self._progress = ChunkProgress(capacity=1000)
        self._tickets: dict[str, tuple[str, float]] = {}  # user → (typing ticket, valid until)
        self._typing: set[str] = set()  # chats shown typing, cancelled after the answer
        self.logins = BackgroundLogin(self._http, settings, self.client.identity, context.records)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        # Started even before a login: the holder waits for a token in the records.
        self._holder = HeldConnection(self.context.hold_connection, self.connection, self._poll)

    async def stop(self) -> None:
        if self._holder is not None:
            await self._holder.release()
            self._holder = None
        await self.logins.stop()
        await self._http.aclose()

    async def _credentials(self) -> bool:
        """Point the client at the current login; False while there is none or it expired.

        An active stored login wins; else `WEIXIN_BOT_TOKEN`, unless that is the token that
        expired (then only a new login, or a new token in the settings, resumes).
        """
        stored = await login.load(self.context.records, self.settings.account)
        env = self.settings.bot_token
        if stored is not None and stored.status == "active" and stored.bot_token != self._stale:
            self.client.token, self.client.base_url = stored.bot_token, stored.base_url
            self.bot_id = stored.bot_id
        elif env and env != self._stale and (stored is None or stored.bot_token != env):
            self.client.token, self.client.base_url = env, self.settings.api_base_url
            self.bot_id = None
        else:
            self.expired = (stored.error if stored is not None else None) or (
                SESSION_EXPIRED if self._stale else NOT_LOGGED_IN
            )
            return False
        self.expired = None
        return True

    async def _expire(self, exc: ILinkError) -> None:
        token = self._stale = self.client.token or ""
        self.expired = f"session expired (errcode -14: {exc.errmsg or 'stale token'}); log in again"
        log.error(
            "weixin_session_expired",
            account=self.settings.account,
            token=fingerprint(token),
            detail="polling paused until `chatgate channels weixin login` stores a new token",
        )
        await login.mark_expired(
            self.context.records, self.settings.account, token, self.client.base_url, self.expired
        )

    async def problem(self) -> str | None:
        """What keeps the channel from working, from the stored login (true on every replica,
        not only the poller's); the dashboard shows it as the channel's error."""
        stored = await login.load(self.context.records, self.settings.account)
        env = self.settings.bot_token
        if stored is not None and stored.status == "active":
            return None
        if env and (stored is None or stored.bot_token != env):
            return None
        if stored is not None:
            return f"{stored.error or SESSION_EXPIRED} (since {stored.expired_at})"
        return NOT_LOGGED_IN

    # --- inbound: the long poll ---------------------------------------------------------

    async def _poll(self) -> None:
        state = await self.context.connection_state.load_state(self.connection) or {}
        cursor, cursor_bot = str(state.get("cursor") or ""), state.get("bot")
        timeout = self.settings.poll_timeout_seconds
        failures = 0
        announced: str | None = None  # the token iLink was told about (notifystart)
        while True:
            if not await self._credentials():
                await asyncio.sleep(self.settings.expired_check_seconds)
                continue
            if cursor_bot != self.bot_id:  # another bot logged in: its messages start afresh
                cursor, cursor_bot = "", self.bot_id
            if announced != self.client.token:
                announced = self.client.token
                with contextlib.suppress(ILinkError, httpx.HTTPError):
                    await self.client.notify("start")
            try:
                # The server holds the poll up to its own time; the client waits a little longer.
                data = await self.client.get_updates(cursor, timeout + 5.0)
            except SessionExpired as exc:
                await self._expire(exc)
                continue
            except (ILinkError, httpx.HTTPError, ValueError) as exc:
                failures += 1
                self.poll_error = f"getupdates failed: {exc!s}"
                log.warning("weixin_poll_failed", error=str(exc), failures=failures)
                pause = self.settings.poll_backoff_seconds if failures >= MAX_FAILURES else 0
                await asyncio.sleep(pause or self.settings.poll_retry_seconds)
                failures = 0 if failures >= MAX_FAILURES else failures
                continue
            failures, self.poll_error = 0, None
            hold = data.get("longpolling_timeout_ms")
            if isinstance(hold, int | float) and hold > 0:
                timeout = hold / 1000
            for msg in data.get("msgs") or []:
                # Raises (the database away): the cursor stays, the messages come again.
                await self._receive(msg)
            new = data.get("get_updates_buf")
            if isinstance(new, str) and new and new != cursor:
                cursor = new
                state = {"cursor": cursor, "bot": cursor_bot}
                if not await self.context.connection_state.save_state(self.connection, state):
                    log.warning("weixin_cursor_not_saved", detail="the connection is no longer ours")
                    return

    async def _receive(self, msg: Any) -> None:
        try:
            await self._store(msg)
        except ChannelRequestError as exc:  # a message we cannot use: skip it, never loop on it
            log.warning("weixin_message_refused", detail=exc.detail)

    async def _store(self, msg: Any) -> None:
        parsed = parse_message(msg, self.settings)
        if parsed.event is None:
            return
        event = parsed.event
        if parsed.context_token and self.context.records is not None:
            await self._keep_token(event.chat_id, parsed.context_token, parsed.sent_at_ms)
        try:
            event = await inline_media(
                event,
                lambda part: self._fetch(parsed.media, part),
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,
            )
        except MediaTooLarge as exc:
            await self._too_large(event, exc.limit)
            return
        await self.context.accept([event])

    async def _keep_token(self, chat_id: str, token: str, sent_at_ms: int) -> None:
        """Keep the peer's newest token: a message given again after a takeover is older."""
        assert self.context.records is not None
        current = await self.context.records.get(PEER, chat_id)
        if current is not None and int(current.data.get("sent_at_ms") or 0) > sent_at_ms:
            return
        data = {"context_token": token, "sent_at_ms": sent_at_ms}
        await self.context.records.put(PEER, chat_id, data, open=False)

    async def _fetch(self, refs: dict[str, MediaRef], part: ImagePart | FilePart) -> Media | None:
        ref = refs.get(part.url or "")
        if ref is None:
            return None
        return await cdn.download(
            self.context.fetcher, ref, self.settings.cdn_base_url, self.settings.media_max_bytes
        )

    async def _too_large(self, event: InboundEvent, limit: int) -> None:
        await tell_too_large(self.send, event, self.settings.locale, limit)

    # --- outbound -------------------------------------------------------------------------

    async def _context_token(self, message: OutboundMessage) -> str | None:
        if self.context.records is not None:
            record = await self.context.records.get(PEER, message.chat_id)
            if record is not None and record.data.get("context_token"):
                return str(record.data["context_token"])
        token = message.metadata.get("reply_context_token")
        return str(token) if token else None

    async def send(self, message: OutboundMessage) -> SendResult:
        if not await self._credentials():
            # Retried with backoff: a new login soon delivers it; later it is a dead letter.
            raise ChannelSendAuthError(f"WeChat (iLink): {self.expired}", retryable=True)
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = [p for p in message.parts if isinstance(p, ImagePart | FilePart) and p.data_base64]
        if not chunks and not media:
            return SendResult()
        token = await self._context_token(message)
        to = message.chat_id

        async def deliver(index: int, _item: str) -> str:
            if index < len(chunks):
                item: dict[str, Any] = {"type": ITEM_TEXT, "text_item": {"text": chunks[index]}}
            else:
                item = await self._upload(media[index - len(chunks)], to)
            return await self._send_item(to, item, token, f"chatgate:{message.message_id}:{index}")

        items = [*chunks, *(f"media:{i}" for i in range(len(media)))]
        try:
            sent = await send_chunks(self._progress, message.message_id, items, deliver)
        finally:
            await self._stop_typing(message)
        return SendResult(platform_message_id=next((s for s in sent if s), None))

    async def _send_item(self, to: str, item: dict[str, Any], token: str | None, client_id: str) -> str:
        msg = {
            "from_user_id": "",
            "to_user_id": to,
            "client_id": client_id,
            "message_type": MESSAGE_TYPE_BOT,
            "message_state": MESSAGE_STATE_FINISH,
            "item_list": [item],
            "context_token": token,
        }
        answer = await self._call(self.client.send_message(msg))
        return str(answer.get("message_id") or client_id)

    async def _upload(self, part: ImagePart | FilePart, to: str) -> dict[str, Any]:
        assert part.data_base64 is not None
        data = base64.b64decode(part.data_base64)
        mime = part.mime_type or ""
        if isinstance(part, FilePart) and voice.can_voice(mime, part.name):
            try:
                note = await asyncio.to_thread(voice.to_voice, data, mime, part.name)
            except voice.NotVoice as exc:
                log.warning("weixin_voice_sent_as_file", reason=str(exc))
            else:
                return await self._upload_voice(note, to)
        kind = (
            UPLOAD_IMAGE
            if isinstance(part, ImagePart)
            else UPLOAD_VIDEO
            if mime.startswith("video/")
            else UPLOAD_FILE
        )
        up = await self._call(
            cdn.upload(
                self.client,
                self._http,
                data,
                media_type=kind,
                to_user=to,
                cdn_base=self.settings.cdn_base_url,
            )
        )
        media = cdn.cdn_media(up)
        if kind == UPLOAD_IMAGE:
            return {"type": ITEM_IMAGE, "image_item": {"media": media, "mid_size": up.cipher_size}}
        if kind == UPLOAD_VIDEO:
            return {"type": ITEM_VIDEO, "video_item": {"media": media, "video_size": up.cipher_size}}
        name = getattr(part, "name", None) or "file"
        return {"type": ITEM_FILE, "file_item": {"media": media, "file_name": name, "len": str(up.size)}}

    async def _upload_voice(self, note: voice.Voice, to: str) -> dict[str, Any]:
        up = await self._call(
            cdn.upload(
                self.client,
                self._http,
                note.silk,
                media_type=UPLOAD_VOICE,
                to_user=to,
                cdn_base=self.settings.cdn_base_url,
            )
        )
        item = {
            "media": cdn.cdn_media(up),
            "encode_type": voice.ENCODE_SILK,
            "bits_per_sample": 16,
            "sample_rate": voice.SILK_SAMPLE_RATE,
            "playtime": note.playtime_ms,
        }
        return {"type": ITEM_VOICE, "voice_item": item}

    async def _call(self, call: Any) -> Any:
        """Await an iLink call, its failures as the outbox's delivery errors."""
        try:
            return await call
        except SessionExpired as exc:
            await self._expire(exc)
            raise ChannelSendAuthError(f"WeChat (iLink): {self.expired}", retryable=True) from exc
        except ILinkError as exc:
            raise ChannelRejected(f"WeChat (iLink) refused: {exc}") from exc
        except httpx.HTTPStatusError as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise ChannelSendAuthError(f"WeChat (iLink) answered {status}") from exc
            if status == 429 or status >= 500:
                raise ChannelUnavailable(f"WeChat (iLink) answered {status}") from exc
            raise ChannelRejected(f"WeChat (iLink) answered {status}") from exc
        except (httpx.HTTPError, ValueError) as exc:
            raise ChannelUnavailable(f"WeChat (iLink) unreachable: {exc!r}") from exc

    # --- typing (`native` streaming) ------------------------------------------------------

    async def _ticket(self, user: str, token: str | None) -> str | None:
        """The user's typing ticket (`getconfig`), kept an hour; a failure is asked again
        after a minute, not every few seconds of a turn."""
        cached = self._tickets.get(user)
        if cached is not None and time.monotonic() < cached[1]:
            return cached[0] or None
        try:
            answer = await self._call(self.client.get_config(user, token))
        except DeliveryError:
            self._tickets[user] = ("", time.monotonic() + TICKET_RETRY_SECONDS)
            raise
        ticket = str(answer.get("typing_ticket") or "")
        self._tickets[user] = (ticket, time.monotonic() + TICKET_TTL_SECONDS)
        return ticket or None

    async def typing(self, message: OutboundMessage) -> None:
        if message.metadata.get("reply_to_user") != message.chat_id:
            return  # typing is a direct chat's (`ilink_user_id`); none in groups
        if self.expired is not None:
            return
        ticket = await self._ticket(message.chat_id, await self._context_token(message))
        if ticket is not None:
            await self._call(self.client.send_typing(message.chat_id, ticket, TYPING))
            self._typing.add(message.chat_id)

    async def _stop_typing(self, message: OutboundMessage) -> None:
        if message.chat_id not in self._typing:
            return
        self._typing.discard(message.chat_id)
        ticket = self._tickets.get(message.chat_id, ("", 0.0))[0]
        with contextlib.suppress(DeliveryError):
            if ticket:
                await self._call(self.client.send_typing(message.chat_id, ticket, TYPING_CANCEL))

    def streamer(self) -> WeixinTyping | None:
        if self.settings.streaming is StreamingMode.OFF:
            return None
        return WeixinTyping(self)


__all__ = ["WeixinChannel"]
