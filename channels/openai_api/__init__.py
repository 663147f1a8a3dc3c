"""OpenAI-compatible API (`/v1/models`, `/v1/chat/completions`) over chatgate's sessions."""

from app.channel import ChannelSpec
from channels.openai_api.adapter import OpenAIChannel
from channels.openai_api.settings import OpenAIApiSettings

CHANNEL = ChannelSpec(name="openai", settings_class=OpenAIApiSettings, factory=OpenAIChannel)

__all__ = ["CHANNEL", "OpenAIApiSettings", "OpenAIChannel"]
