"""The generic signed webhook channel (`POST /channels/webhook`)."""

from app.channel import ChannelSpec
from channels.webhook.adapter import WebhookChannel, WebhookSettings

CHANNEL = ChannelSpec(name="webhook", settings_class=WebhookSettings, factory=WebhookChannel)

__all__ = ["CHANNEL", "WebhookChannel", "WebhookSettings"]
