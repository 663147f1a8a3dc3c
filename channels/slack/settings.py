"""Settings of the Slack channel (`SLACK_…`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.events import SessionScope
from app.streaming.protocol import StreamingMode
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings


class SlackSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="SLACK_", env_file=".env", extra="ignore")
    # native: chat.startStream / appendStream / stopStream (`channels.slack.native_stream`).
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset(StreamingMode)
    deletes_messages: ClassVar[bool] = True  # chat.delete (docs/events.md)

    # Slack conversations live in threads, so a thread is a session unless configured otherwise.
    session_scope: SessionScope = Field(
        SessionScope.THREAD,
        description="chat, thread or user_in_chat (thread: one session per Slack thread).",
    )
    bot_token: str | None = Field(None, description="Bot User OAuth Token (xoxb-…).")
    signing_secret: str | None = Field(None, description="Signing Secret of the app (Basic Information).")
    mode: Literal["events", "socket"] = Field(
        "events", description="events (HTTP Events API) or socket (Socket Mode, development)."
    )
    app_token: str | None = Field(None, description="App-level token (xapp-…) for Socket Mode.")
    api_base_url: str = Field("https://slack.com/api/", description="Slack Web API base URL.")
    bot_user_id: str | None = Field(
        None, description="The bot's user id (U…); asked with auth.test when unset."
    )
    reply_in_thread: bool = Field(
        True, description="Answer a channel message in a thread under it (its ts becomes the thread)."
    )
    max_message_chars: int = Field(
        4000, ge=100, le=40_000, description="Longer replies are split (Slack truncates at 40,000)."
    )
    timestamp_tolerance_seconds: int = Field(300, description="Requests signed longer ago are refused.")
    request_timeout_seconds: int = Field(15, description="Timeout of Web API calls.")
    files_base_url: str = Field(
        "https://files.slack.com/", description="Only url_private links under this URL get the bot token."
    )
    stream_edit_seconds: float = Field(
        1.5, ge=0.05, description="Least time between two chat.update calls of a preview (tier 3)."
    )
