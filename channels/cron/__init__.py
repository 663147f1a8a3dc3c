"""The cron channel: stored jobs fire into their source session (`CHANNELS=…,cron`)."""

from app.channel import ChannelSpec
from channels.cron.adapter import CronChannel, CronSettings, Fire, fire_event

CHANNEL = ChannelSpec(name="cron", settings_class=CronSettings, factory=CronChannel)

__all__ = ["CHANNEL", "CronChannel", "CronSettings", "Fire", "fire_event"]
