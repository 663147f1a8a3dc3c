"""The Telegram channel (`POST /channels/telegram`, or long polling for development)."""

from app.channel import ChannelSpec
from channels.telegram.adapter import TelegramChannel
from channels.telegram.settings import TelegramSettings

CHANNEL = ChannelSpec(name="telegram", settings_class=TelegramSettings, factory=TelegramChannel)

__all__ = ["CHANNEL", "TelegramChannel", "TelegramSettings"]
