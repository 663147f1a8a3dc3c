"""WhatsApp Cloud API (`GET`/`POST /channels/whatsapp`): signed webhooks, Graph API answers."""

from app.channel import ChannelSpec
from channels.whatsapp.adapter import WhatsAppChannel
from channels.whatsapp.settings import WhatsAppSettings

CHANNEL = ChannelSpec(name="whatsapp", settings_class=WhatsAppSettings, factory=WhatsAppChannel)

__all__ = ["CHANNEL", "WhatsAppChannel", "WhatsAppSettings"]
