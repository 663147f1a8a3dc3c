"""Settings of the LINE Messaging API channel (`LINE_…`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings


class LineSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="LINE_", env_file=".env", extra="ignore")
    # LINE messages cannot be edited; `native` is the loading animation while a turn runs.
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset({StreamingMode.OFF, StreamingMode.NATIVE})
    streaming: StreamingMode = Field(
        StreamingMode.NATIVE,
        description="native (LINE's loading animation in one-to-one chats while a turn runs, then the "
        "answer) or off. LINE messages cannot be edited, so there is no edit mode.",
    )

    channel_secret: str | None = Field(
        None, description="The channel secret (LINE Developers console, Basic settings): signs webhooks."
    )
    channel_access_token: str | None = Field(
        None,
        description="A long-lived channel access token (Messaging API tab): replies, pushes, content.",
    )
    api_base_url: str = Field("https://api.line.me", description="Messaging API base URL.")
    data_api_base_url: str = Field(
        "https://api-data.line.me", description="Content API base URL (images, files, audio by message id)."
    )
    reply_window_seconds: float = Field(
        50.0,
        gt=0,
        le=3600,
        description="Answer with the event's reply token (free, single use) while it is younger than this; "
        "later answers are push messages (they count against the monthly quota). LINE: about a minute.",
    )
    max_text_chars: int = Field(
        5000, ge=16, le=5000, description="Longer replies are split (LINE's limit: 5,000 characters)."
    )
    loading_seconds: int = Field(
        20,
        ge=5,
        le=60,
        multiple_of=5,
        description="Length of one loading animation (5-60, a multiple of 5); renewed while the turn runs.",
    )
    api_timeout_seconds: float = Field(15.0, gt=0, description="Timeout of one API request.")
