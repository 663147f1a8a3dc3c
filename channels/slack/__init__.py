"""The Slack channel (`POST /channels/slack/events`, or Socket Mode for development)."""

from app.channel import ChannelSpec
from channels.slack.adapter import SlackChannel
from channels.slack.settings import SlackSettings

CHANNEL = ChannelSpec(name="slack", settings_class=SlackSettings, factory=SlackChannel)

__all__ = ["CHANNEL", "SlackChannel", "SlackSettings"]
