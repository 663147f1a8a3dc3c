"""Native streaming on Telegram (`TELEGRAM_STREAMING=native`): previews as message drafts.

`sendMessageDraft` (Bot API 9.3; PTB `Bot.send_message_draft`) streams a partial
message to a user while it is being written: each call replaces the draft's text, calls
with the same `draft_id` animate one draft. A draft is ephemeral (Telegram shows it for
about 30 s after its last update; a draft unchanged for `TELEGRAM_DRAFT_REFRESH_SECONDS` is
sent again on the hub's typing tick) and never becomes a message by itself: the answer is a
normal `sendMessage` through the outbox (`finish` is the channel's `send`), so it is
delivered exactly once whatever happened to the draft.

Drafts exist only in private chats. In a group this streamer previews as edit mode does
(`sendMessage` + `editMessageText`, the given `fallback`); the stored preview id tells
the two apart (`draft:<id>` for a draft). A draft Telegram refuses
(`PreviewUnavailable`) leaves the turn without a preview; the answer is sent as usual.
The draft id is derived from the answered event, so a turn re-run after a restart goes
on animating the same draft.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from telegram import Bot

from app.channel import SendResult
from app.errors import ChannelRejected, PreviewUnavailable
from app.events import OutboundMessage, TextPart
from app.streaming.protocol import Streamer
from channels.telegram.errors import telegram_errors

if TYPE_CHECKING:
    from channels.telegram.settings import TelegramSettings

_DRAFT = "draft:"
_REMEMBERED = 1000  # drafts whose last text this process keeps (to send again)


class TelegramChannel(Protocol):
    """What the streamer needs from the channel (`channels.telegram.adapter.TelegramChannel`)."""

    settings: TelegramSettings

    async def send(self, message: OutboundMessage) -> SendResult: ...


class TelegramDraftStreamer:
    def __init__(self, channel: TelegramChannel, bot: Bot, fallback: Streamer) -> None:
        self.channel = channel
        self.bot = bot
        self.fallback = fallback
        self.edit_interval = channel.settings.stream_edit_seconds
        self.max_preview_chars = channel.settings.max_message_chars
        self.refresh_after = channel.settings.draft_refresh_seconds
        # (chat id, draft id) -> the draft's text and when it was sent (this process)
        self._drafts: OrderedDict[tuple[int, int], tuple[str, float]] = OrderedDict()

    async def typing(self, message: OutboundMessage) -> None:
        """Typing, and the draft sent again when it would fade (a long tool call, a slow model)."""
        chat_id = _private_chat(message)
        last = self._drafts.get((chat_id, draft_id_for(message))) if chat_id is not None else None
        if chat_id is not None and last is not None and time.monotonic() - last[1] >= self.refresh_after:
            text = message.model_copy(update={"parts": (TextPart(text=last[0]),)})
            await self._draft(chat_id, draft_id_for(message), text)
        await self.fallback.typing(message)

    async def open(self, message: OutboundMessage) -> str:
        chat_id = _private_chat(message)
        if chat_id is None:
            return await self.fallback.open(message)
        draft_id = draft_id_for(message)
        try:
            await self._draft(chat_id, draft_id, message)
        except ChannelRejected as exc:
            raise PreviewUnavailable(f"Telegram refused sendMessageDraft: {exc.detail}") from exc
        return f"{_DRAFT}{draft_id}"

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        chat_id = _private_chat(message)
        if not preview_id.startswith(_DRAFT) or chat_id is None:
            await self.fallback.edit(message, preview_id)
            return
        await self._draft(chat_id, int(preview_id.removeprefix(_DRAFT)), message)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        if not preview_id.startswith(_DRAFT):
            return await self.fallback.finish(message, preview_id)
        # The draft is a preview only: the answer is a message of its own (chunked, quoted,
        # with its media), which takes the draft's place in the user's chat.
        chat_id = _private_chat(message)
        self._drafts.pop((chat_id or 0, int(preview_id.removeprefix(_DRAFT))), None)
        return await self.channel.send(message)

    async def _draft(self, chat_id: int, draft_id: int, message: OutboundMessage) -> None:
        thread = message.thread_id
        with telegram_errors():
            await self.bot.send_message_draft(
                chat_id=chat_id,
                draft_id=draft_id,
                text=message.text,
                message_thread_id=int(thread) if thread and thread.isdigit() else None,
            )
        self._drafts[(chat_id, draft_id)] = (message.text, time.monotonic())
        self._drafts.move_to_end((chat_id, draft_id))
        while len(self._drafts) > _REMEMBERED:
            self._drafts.popitem(last=False)


def draft_id_for(message: OutboundMessage) -> int:
    """A non-zero draft id, the same for every preview of one answered event."""
    key = message.in_reply_to_event or message.message_id
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % (2**31 - 1) + 1


def _private_chat(message: OutboundMessage) -> int | None:
    """The chat id when the message goes to a private chat (positive ids), else None."""
    try:
        chat_id = int(message.chat_id)
    except ValueError:
        return None  # @channelusername
    return chat_id if chat_id > 0 else None
