"""The Discord channel: messages over the Gateway, slash commands at `POST /channels/discord/interactions`."""

from app.channel import ChannelSpec
from channels.discord.adapter import DiscordChannel
from channels.discord.settings import DiscordSettings

CHANNEL = ChannelSpec(name="discord", settings_class=DiscordSettings, factory=DiscordChannel)

__all__ = ["CHANNEL", "DiscordChannel", "DiscordSettings"]
