"""Discord settings (`DISCORD_*`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings


class DiscordSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="DISCORD_", env_file=".env", extra="ignore")
    deletes_messages: ClassVar[bool] = True  # DELETE /channels/{id}/messages/{id} (docs/events.md)

    bot_token: str | None = Field(None, description="Bot token (Developer Portal → Bot).")
    public_key: str | None = Field(
        None, description="Application public key (hex), to verify interactions (Ed25519)."
    )
    api_base: str = Field("https://discord.com/api/v10", description="REST API base URL.")
    gateway_url: str | None = Field(
        None, description="Gateway WebSocket URL; unset: the one GET /gateway/bot names."
    )
    gateway: bool = Field(True, description="Receive messages over the Gateway (needs the bot token).")
    max_message_chars: int = Field(
        2000, description="Discord's message length limit; longer texts are split."
    )
    timestamp_tolerance_seconds: float = Field(
        300.0, description="Interactions whose X-Signature-Timestamp is further from now are refused."
    )
    request_timeout_seconds: float = Field(15.0, description="Timeout of REST calls.")
    stream_edit_seconds: float = Field(
        1.2,
        ge=0.05,
        description="Least time between two edits of a preview (Discord allows about 5 per 5 s per channel).",
    )
    cdn_base: str = Field(
        "https://cdn.discordapp.com/", description="Only attachments under this URL are downloaded."
    )
