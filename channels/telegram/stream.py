"""Streamed replies on Telegram: a preview message sent, then edited in place."""

from __future__ import annotations

from app.channel import SendResult
from app.errors import ChannelRejected
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from channels.telegram.outbound import TelegramOutbound, chat_id_of, quote_of, thread, uploadable
from channels.telegram.settings import TelegramSettings
from channels.telegram.text import split_text


class TelegramStreamer:
    """Previews as `sendMessage` + `editMessageText`, typing as `sendChatAction`.

    Telegram allows about one message per second per chat (`TELEGRAM_STREAM_EDIT_SECONDS`).
    """

    def __init__(self, outbound: TelegramOutbound, settings: TelegramSettings) -> None:
        self.outbound = outbound
        self.settings = settings
        self.edit_interval = settings.stream_edit_seconds
        self.max_preview_chars = settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        await self.outbound.typing(chat_id_of(message.chat_id), thread(message))

    async def open(self, message: OutboundMessage) -> str:
        reply = quote_of(message)
        sent = await self.outbound.send_text(
            chat_id_of(message.chat_id), message.text, thread(message), reply
        )
        return str(sent)

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        await self.outbound.edit(chat_id_of(message.chat_id), int(preview_id), message.text)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = [p for p in message.parts if isinstance(p, (ImagePart, FilePart)) and uploadable(p)]
        chat_id, thread_id = chat_id_of(message.chat_id), thread(message)

        async def deliver(index: int, chunk: str) -> int:
            if index >= len(chunks):
                return await self.outbound.upload(chat_id, media[index - len(chunks)], thread_id, None)
            if index > 0:
                return await self.outbound.send_text(chat_id, chunk, thread_id, None)
            try:
                await self.edit(message.model_copy(update={"parts": (TextPart(text=chunk),)}), preview_id)
            except ChannelRejected as exc:
                if "not found" not in exc.detail.lower():
                    raise
                # The preview was deleted: the answer replaces it as a new message.
                return await self.outbound.send_text(chat_id, chunk, thread_id, quote_of(message))
            return int(preview_id)

        items = [*chunks, *(f"media:{i}" for i in range(len(media)))]
        sent = await self.outbound.steps(message.message_id, items, deliver)
        return SendResult(platform_message_id=str(sent[0]) if sent else preview_id)
