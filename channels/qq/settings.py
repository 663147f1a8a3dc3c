"""Settings of the QQ official bot channel (`QQ_…`)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from channels.common.progress import check_streaming


class QQSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="QQ_", env_file=".env", extra="ignore")

    app_id: str | None = Field(None, description="The bot's AppID (QQ open platform).")
    app_secret: str | None = Field(None, description="The bot's AppSecret: signs callbacks, gets tokens.")
    api_base_url: str = Field("https://api.sgroup.qq.com", description="QQ bot OpenAPI base URL.")
    token_url: str = Field(
        "https://bots.qq.com/app/getAppAccessToken", description="Where app access tokens come from."
    )
    timestamp_tolerance_seconds: int = Field(
        300, description="Refuse callbacks signed longer ago than this (0 turns the check off)."
    )
    max_text_chars: int = Field(2000, description="Longer replies are sent as several messages.")
    api_timeout_seconds: float = Field(10.0, description="Timeout of one OpenAPI request.")
    media_max_bytes: int = Field(
        10_000_000,
        ge=1,
        description="Larger images, voice, videos and files are refused with a polite reply.",
    )
    streaming: StreamingMode = Field(
        StreamingMode.OFF, description="off only: the QQ bot API cannot edit a sent message (no previews)."
    )
    working_notice_seconds: float | None = Field(
        None,
        gt=0,
        description="Send one short 'working…' notice when a turn runs longer (it uses one of the "
        "message's passive replies); unset: none.",
    )

    approval_buttons: bool = Field(
        False,
        description="Send approval prompts as markdown with Approve/Deny callback buttons (a custom "
        "keyboard: markdown and custom keyboards are permissions QQ grants by invitation); off: "
        "the prompt is text and `/approve <id>` is typed.",
    )

    @field_validator("streaming")
    @classmethod
    def _no_previews(cls, value: StreamingMode) -> StreamingMode:
        return check_streaming("The QQ bot API", value, (StreamingMode.OFF,))
