"""The LINE Messaging API (`POST /channels/line`): signed webhooks, reply tokens then pushes."""

from app.channel import ChannelSpec
from channels.line.adapter import LineChannel
from channels.line.settings import LineSettings

CHANNEL = ChannelSpec(name="line", settings_class=LineSettings, factory=LineChannel)

__all__ = ["CHANNEL", "LineChannel", "LineSettings"]
