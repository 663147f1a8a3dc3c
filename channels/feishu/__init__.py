"""The Feishu/Lark channel (`POST /channels/feishu`, event subscription schema 2.0)."""

from app.channel import ChannelSpec
from channels.feishu.adapter import FeishuChannel
from channels.feishu.settings import FeishuSettings

CHANNEL = ChannelSpec(name="feishu", settings_class=FeishuSettings, factory=FeishuChannel)

__all__ = ["CHANNEL", "FeishuChannel", "FeishuSettings"]
