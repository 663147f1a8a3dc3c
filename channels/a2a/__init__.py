"""A2A server: other agents call chatgate over the A2A protocol (`POST /a2a`)."""

from app.channel import ChannelSpec
from channels.a2a.adapter import A2AChannel
from channels.a2a.settings import A2ASettings

CHANNEL = ChannelSpec(name="a2a", settings_class=A2ASettings, factory=A2AChannel)

__all__ = ["CHANNEL", "A2AChannel", "A2ASettings"]
