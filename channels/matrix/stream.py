"""Streamed replies on Matrix: a preview message sent, then edited in place (`m.replace`).

Clients show an edit as the message's new text (marked "edited"); the final answer is the
preview's last edit, with its later chunks and files as further messages. Homeservers
rate-limit sending per user; a 429 carries `retry_after_ms`, which slows the preview down.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from app.channel import SendResult
from app.events import OutboundMessage

if TYPE_CHECKING:
    from channels.matrix.adapter import MatrixChannel


class MatrixStreamer:
    def __init__(self, channel: MatrixChannel) -> None:
        self.channel = channel
        self.edit_interval = channel.settings.stream_edit_seconds
        self.max_preview_chars = channel.settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        await self.channel.typing(message)

    async def open(self, message: OutboundMessage) -> str:
        content = self.channel.text_content(message, message.text, first=True)
        # A fresh transaction id: a second preview of the same message is a new message.
        return await self.channel.put(message.chat_id, content, f"chatgate-preview-{uuid.uuid4().hex}")

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        await self.channel.replace(message, preview_id, message.text)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        return await self.channel.finish(message, preview_id)
