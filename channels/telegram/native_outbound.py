"""What Telegram sends for platform-native events (docs/events.md), beside plain replies.

- a deletion (`DELETE_KEY`, our answer to a recalled message): `deleteMessage`;
- a private notice answering a button press (`PRIVATE_NOTICE_KEY`, e.g. a refused
  approval): `answerCallbackQuery` with `show_alert`, nothing in the chat;
- any other reply to a press: sent to the chat, and the query answered without text;
- an approval prompt (`APPROVAL_KEY`): sent, then given approve/deny buttons
  (`editMessageReplyMarkup`), so the plain send path stays as it is.
"""

from __future__ import annotations

import structlog
from telegram import Bot
from telegram.error import BadRequest, TelegramError

from app.channel import SendResult
from app.events import APPROVAL_KEY, DELETE_KEY, PRIVATE_NOTICE_KEY, OutboundMessage
from channels.telegram.errors import telegram_errors
from channels.telegram.native import CALLBACK_KEY, approval_keyboard
from channels.telegram.outbound import chat_id_of

log = structlog.get_logger(__name__)


class TelegramNativeOutbound:
    def __init__(self, bot: Bot, locale: str) -> None:
        self.bot = bot
        self.locale = locale

    async def before_send(self, message: OutboundMessage) -> bool:
        """Handle what is no plain send; True when nothing is left to send."""
        metadata = message.metadata
        if DELETE_KEY in metadata:
            with telegram_errors():  # flood control and outages are retried by the outbox
                try:
                    await self.bot.delete_message(chat_id_of(message.chat_id), int(metadata[DELETE_KEY]))
                except BadRequest as exc:  # already gone, or older than 48 hours: nothing to retry
                    log.info("telegram_delete_refused", detail=exc.message)
            return True
        query = metadata.get(CALLBACK_KEY)
        if query and metadata.get(PRIVATE_NOTICE_KEY):
            await self._answer(str(query), message.text, alert=True)
            return True
        return False

    async def after_send(self, message: OutboundMessage, result: SendResult) -> None:
        metadata = message.metadata
        query = metadata.get(CALLBACK_KEY)
        if query:
            await self._answer(str(query), None, alert=False)
        if APPROVAL_KEY in metadata and result.platform_message_id:
            try:
                await self.bot.edit_message_reply_markup(
                    chat_id_of(message.chat_id),
                    int(result.platform_message_id),
                    reply_markup=approval_keyboard(metadata[APPROVAL_KEY], self.locale),
                )
            except Exception as exc:  # the prompt is sent; `/approve <id>` still works without buttons
                log.warning("telegram_approval_buttons_failed", error=repr(exc))

    async def _answer(self, query: str, text: str | None, *, alert: bool) -> None:
        """Answer a button press; best-effort (a query answered or too old is refused)."""
        try:
            await self.bot.answer_callback_query(query, text=text[:200] if text else None, show_alert=alert)
        except TelegramError as exc:
            log.info("telegram_callback_answer_refused", detail=exc.message)
