"""Email: one IMAP mailbox (IDLE or polling, one holder across replicas), answers by SMTP."""

from app.channel import ChannelSpec
from channels.email.adapter import EmailChannel
from channels.email.settings import EmailSettings

CHANNEL = ChannelSpec(name="email", settings_class=EmailSettings, factory=EmailChannel)

__all__ = ["CHANNEL", "EmailChannel", "EmailSettings"]
