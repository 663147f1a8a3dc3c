"""Personal WeChat through Tencent's iLink bot API (QR login, long poll; no public URL)."""

from app.channel import ChannelSpec
from channels.weixin.adapter import WeixinChannel
from channels.weixin.doctor import check
from channels.weixin.settings import WeixinSettings

CHANNEL = ChannelSpec(name="weixin", settings_class=WeixinSettings, factory=WeixinChannel, doctor=check)

__all__ = ["CHANNEL", "WeixinChannel", "WeixinSettings"]
