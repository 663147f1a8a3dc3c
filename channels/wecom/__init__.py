"""WeCom (企业微信) self-built app: `GET, POST /channels/wecom`."""

from app.channel import ChannelSpec
from channels.wecom.adapter import WeComChannel, WeComSettings

CHANNEL = ChannelSpec(name="wecom", settings_class=WeComSettings, factory=WeComChannel)

__all__ = ["CHANNEL", "WeComChannel", "WeComSettings"]
