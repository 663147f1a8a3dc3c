"""OneBot v11 bridges (QQ through NapCat/Lagrange, WeChat bridges): `WS /channels/onebot/ws`
(reverse WebSocket) and `POST /channels/onebot` (HTTP POST mode)."""

from app.channel import ChannelSpec
from channels.onebot.adapter import OneBotChannel
from channels.onebot.settings import OneBotSettings

CHANNEL = ChannelSpec(name="onebot", settings_class=OneBotSettings, factory=OneBotChannel)

__all__ = ["CHANNEL", "OneBotChannel", "OneBotSettings"]
