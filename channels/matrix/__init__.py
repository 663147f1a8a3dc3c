"""Matrix (client-server API): a bot account on any homeserver, /sync held by one replica."""

from app.channel import ChannelSpec
from channels.matrix.adapter import MatrixChannel
from channels.matrix.settings import MatrixSettings

CHANNEL = ChannelSpec(name="matrix", settings_class=MatrixSettings, factory=MatrixChannel)

__all__ = ["CHANNEL", "MatrixChannel", "MatrixSettings"]
