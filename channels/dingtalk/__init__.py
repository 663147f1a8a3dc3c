"""The DingTalk channel (Stream mode, or `POST /channels/dingtalk`)."""

from app.channel import ChannelSpec
from channels.dingtalk.adapter import DingTalkChannel
from channels.dingtalk.settings import DingTalkSettings

CHANNEL = ChannelSpec(name="dingtalk", settings_class=DingTalkSettings, factory=DingTalkChannel)

__all__ = ["CHANNEL", "DingTalkChannel", "DingTalkSettings"]
