"""Telegram's outbound seam: the Bot API calls that send, edit and type, for replies and previews.

`TelegramOutbound` is what the adapter's `send` and the streamers (`stream.py`,
`drafts.py`) use: one `Bot`, one error mapping (`telegram_errors`) and one record of the
chunks already delivered per outbox message (`channels.common.steps`), so a retried reply never
sends a chunk twice, whoever sent it first.
"""

from __future__ import annotations

import base64
from typing import Any

from telegram import Bot, InputFile, ReplyParameters
from telegram.constants import ChatAction
from telegram.error import BadRequest, ChatMigrated

from app.channel import SendResult
from app.events import FilePart, ImagePart, OutboundMessage
from channels.common.steps import Steps
from channels.telegram.errors import telegram_errors
from channels.telegram.settings import TelegramSettings
from channels.telegram.text import split_text


class TelegramOutbound(Steps):
    def __init__(self, bot: Bot, settings: TelegramSettings) -> None:
        super().__init__()
        self.bot = bot
        self.settings = settings

    async def typing(self, chat_id: int | str, thread_id: int | None) -> None:
        """`sendChatAction` typing (about 5 s)."""
        with telegram_errors():
            await self.bot.send_chat_action(
                chat_id=chat_id, action=ChatAction.TYPING, message_thread_id=thread_id
            )

    async def edit(self, chat_id: int | str, message_id: int, text: str) -> None:
        """`editMessageText`; an edit to the same text is no change, not an error."""
        with telegram_errors():
            try:
                await self.bot.edit_message_text(text, chat_id=chat_id, message_id=message_id)
            except BadRequest as exc:
                if "not modified" not in exc.message.lower():
                    raise

    async def send(self, message: OutboundMessage) -> SendResult:
        """The whole reply: its text in chunks, then its media; each step sent once."""
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = [p for p in message.parts if isinstance(p, (ImagePart, FilePart)) and uploadable(p)]
        if not chunks and not media:
            return SendResult()
        chat_id: int | str = chat_id_of(message.chat_id)
        thread_id = int(message.thread_id) if message.thread_id and message.thread_id.isdigit() else None
        quote = message.metadata.get("reply_msg_id")

        async def deliver(index: int, chunk: str) -> int:
            reply = (
                ReplyParameters(message_id=int(quote), allow_sending_without_reply=True)
                if quote is not None and index == 0
                else None
            )
            if index >= len(chunks):  # the text first, then each image or file
                return await self.upload(chat_id, media[index - len(chunks)], thread_id, reply)
            return await self.send_text(chat_id, chunk, thread_id, reply)

        items = [*chunks, *(f"media:{i}" for i in range(len(media)))]
        sent = await self.steps(message.message_id, items, deliver)
        return SendResult(platform_message_id=str(sent[0]) if sent else None)

    async def send_text(
        self, chat_id: int | str, text: str, thread_id: int | None, reply: ReplyParameters | None
    ) -> int:
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

    async def upload(
        self,
        chat_id: int | str,
        part: ImagePart | FilePart,
        thread_id: int | None,
        reply: ReplyParameters | None,
    ) -> int:
        """`sendPhoto` for an image, `sendDocument` for a file: the bytes uploaded, or the URL."""
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


def uploadable(part: ImagePart | FilePart) -> bool:
    """Bytes we hold, or a URL Telegram can fetch (never a platform reference)."""
    return bool(part.data_base64) or (part.url or "").startswith(("http://", "https://"))


def thread_of(thread_id: str | None) -> int | None:
    return int(thread_id) if thread_id and thread_id.isdigit() else None


def thread(message: OutboundMessage) -> int | None:
    return thread_of(message.thread_id)


def quote_of(message: OutboundMessage) -> ReplyParameters | None:
    quote = message.metadata.get("reply_msg_id")
    return (
        ReplyParameters(message_id=int(quote), allow_sending_without_reply=True)
        if quote is not None
        else None
    )


def chat_id_of(value: str) -> int | str:
    """Numeric ids go as integers; `@channelusername` stays a string."""
    try:
        return int(value)
    except ValueError:
        return value
