"""The QQ official bot API (`POST /channels/qq`): Ed25519-signed callbacks, REST replies."""

from app.channel import ChannelSpec
from channels.qq.adapter import QQChannel
from channels.qq.settings import QQSettings

CHANNEL = ChannelSpec(name="qq", settings_class=QQSettings, factory=QQChannel)

__all__ = ["CHANNEL", "QQChannel", "QQSettings"]
