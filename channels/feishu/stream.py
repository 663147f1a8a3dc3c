"""Streamed replies on Feishu: a text message sent, then edited in place (`PUT im/v1/messages/{id}`).

Feishu lets a message be edited at most 20 times (and only text and rich-text messages),
so a preview is edited at most `EDIT_LIMIT - 1` times and the last edit is kept for the
final answer; `FEISHU_STREAM_EDIT_SECONDS` spaces the edits out. Feishu has no typing
state for bots. When the final edit is refused (the preview was recalled, or its edit
budget was spent by a process that died), the preview is recalled
(`DELETE im/v1/messages/{id}`) and the answer sent as a new message: replaced, not left half.

A streaming card (CardKit, `FEISHU_STREAMING=native`) is `channels.feishu.card`; it falls back
to this streamer when Feishu refuses to create the card.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import TYPE_CHECKING

import structlog

from app.channel import SendResult
from app.errors import ChannelRejected, DeliveryError
from app.events import OutboundMessage
from channels.common.steps import held_media

if TYPE_CHECKING:
    from channels.feishu.outbound import FeishuOutbound
    from channels.feishu.settings import FeishuSettings

log = structlog.get_logger(__name__)

EDIT_LIMIT = 20  # edits of one message (Feishu's documented limit)
_REMEMBERED = 1000


class FeishuStreamer:
    def __init__(self, outbound: FeishuOutbound, settings: FeishuSettings) -> None:
        self.outbound = outbound
        self.edit_interval = settings.stream_edit_seconds
        # A preview is one message: far below Feishu's text limit in practice.
        self.max_preview_chars = 4000
        self._edits: OrderedDict[str, int] = OrderedDict()  # preview id -> edits made (this process)

    async def typing(self, message: OutboundMessage) -> None:
        return None

    async def open(self, message: OutboundMessage) -> str:
        sent = await self.outbound.post_message(message, "text", _text(message.text))
        if not sent:
            raise ChannelRejected("Feishu answered the preview without a message_id")
        return sent

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        if self._edits.get(preview_id, 0) >= EDIT_LIMIT - 1:
            return  # the last edit is the answer's
        await self._put(preview_id, message.text)

    async def _put(self, preview_id: str, text: str) -> None:
        await self.outbound.edit_text(preview_id, text)
        self._edits[preview_id] = self._edits.get(preview_id, 0) + 1
        self._edits.move_to_end(preview_id)
        while len(self._edits) > _REMEMBERED:
            self._edits.popitem(last=False)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = self.outbound.chunks(message)
        media = held_media(message)

        async def deliver(index: int, chunk: str) -> str | None:
            if index > 0 or not chunks:
                return await self.outbound.deliver_step(message, index, chunks, media)
            try:
                await self._put(preview_id, chunk)
            except ChannelRejected as exc:
                # Recalled, or no edits left: the preview goes, the answer comes as a new message.
                log.info("feishu_preview_replaced", preview_id=preview_id, reason=exc.detail)
                try:
                    await self.outbound.delete(preview_id)
                except DeliveryError as gone:  # already recalled, or too old to recall
                    log.warning("feishu_preview_recall_failed", error=gone.detail)
                return await self.outbound.deliver_step(message, index, chunks, media)
            return preview_id

        return await self.outbound.reply(message.message_id, chunks, len(media), deliver, shown=preview_id)


def _text(text: str) -> str:
    return json.dumps({"text": text}, ensure_ascii=False)
