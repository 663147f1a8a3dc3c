"""WeChat Official Account (公众号): `GET, POST /channels/wechat-mp`."""

from app.channel import ChannelSpec
from channels.wechat_mp.adapter import WeChatMpChannel, WeChatMpSettings

CHANNEL = ChannelSpec(name="wechat-mp", settings_class=WeChatMpSettings, factory=WeChatMpChannel)

__all__ = ["CHANNEL", "WeChatMpChannel", "WeChatMpSettings"]
