"""Channel `cli`: an interactive terminal conversation.

Delivery is local: `send` hands the message to the terminal loop through a queue, so
only the process that owns the terminal claims `cli` outbox rows.
"""

from __future__ import annotations

import asyncio

from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelSettings, SendResult
from app.events import OutboundMessage


class CliSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="CLI_", env_file=".env", extra="ignore")


class CliChannel:
    name = "cli"

    def __init__(self, settings: CliSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.delivered: asyncio.Queue[OutboundMessage] = asyncio.Queue()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> SendResult:
        await self.delivered.put(message)
        return SendResult(platform_message_id=message.message_id)
