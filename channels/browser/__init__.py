"""The browser channel: events from the WebSocket gateway (`WS /ws`, see docs/gateway.md)."""

from app.channel import ChannelSpec
from channels.browser.adapter import BrowserChannel, BrowserSettings

CHANNEL = ChannelSpec(name="browser", settings_class=BrowserSettings, factory=BrowserChannel)

__all__ = ["CHANNEL", "BrowserChannel", "BrowserSettings"]
