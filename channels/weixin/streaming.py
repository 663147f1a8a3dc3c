"""Typing while a turn runs: the only "streaming" iLink has (bot messages cannot be edited)."""

from __future__ import annotations

from typing import Protocol

from app.channel import SendResult
from app.errors import PreviewUnavailable
from app.events import OutboundMessage
from channels.weixin.settings import WeixinSettings


class TypingChannel(Protocol):
    settings: WeixinSettings

    async def typing(self, message: OutboundMessage) -> None: ...
    async def send(self, message: OutboundMessage) -> SendResult: ...


class WeixinTyping:
    """A `Streamer` with typing only: iLink bot messages cannot be edited, so no preview."""

    def __init__(self, channel: TypingChannel) -> None:
        self.channel = channel
        self.edit_interval = 5.0
        self.max_preview_chars = channel.settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        await self.channel.typing(message)

    async def open(self, message: OutboundMessage) -> str:
        raise PreviewUnavailable("iLink messages cannot be edited: no preview")

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        raise PreviewUnavailable("iLink messages cannot be edited: no preview")

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        return await self.channel.send(message)
