"""The terminal channel used by `chatgate chat`."""

from app.channel import ChannelSpec
from channels.cli.adapter import CliChannel, CliSettings

CHANNEL = ChannelSpec(name="cli", settings_class=CliSettings, factory=CliChannel)

__all__ = ["CHANNEL", "CliChannel", "CliSettings"]
