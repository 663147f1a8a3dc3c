"""Settings of the OneBot v11 channel (`ONEBOT_…`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from channels.common.progress import check_streaming


class OneBotSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="ONEBOT_", env_file=".env", extra="ignore")
    deletes_messages: ClassVar[bool] = True  # delete_msg (docs/events.md)

    access_token: str | None = Field(
        None, description="Token bridges must present on the reverse WebSocket; also sent to the HTTP API."
    )
    secret: str | None = Field(None, description="HMAC-SHA1 key of HTTP POST mode (X-Signature).")
    http_api_url: str | None = Field(None, description="The bridge's HTTP API, e.g. http://127.0.0.1:3000.")
    api_timeout_seconds: float = Field(10.0, description="How long an API call waits for the bridge.")
    max_text_chars: int = Field(3000, description="Longer replies are sent as several messages.")
    quote_in_groups: bool = Field(True, description="Group answers quote the message they answer.")
    max_frame_bytes: int = Field(
        1024 * 1024, ge=1, description="Largest reverse-WebSocket frame; larger ones close with 1009."
    )
    media_max_bytes: int = Field(
        10_000_000,
        ge=1,
        description="Larger images, records, videos and files are refused with a polite reply.",
    )
    streaming: StreamingMode = Field(
        StreamingMode.OFF, description="off only: OneBot v11 cannot edit a sent message (no previews)."
    )
    working_notice_seconds: float | None = Field(
        None, gt=0, description="Send one short 'working…' notice when a turn runs longer; unset: none."
    )

    @field_validator("streaming")
    @classmethod
    def _no_previews(cls, value: StreamingMode) -> StreamingMode:
        return check_streaming("OneBot", value, (StreamingMode.OFF,))
