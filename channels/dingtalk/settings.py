"""Settings of the DingTalk channel (`DINGTALK_…`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings


class DingTalkSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="DINGTALK_", env_file=".env", extra="ignore")

    client_id: str | None = Field(None, description="Client ID (AppKey) of the DingTalk app.")
    client_secret: str | None = Field(
        None, description="Client Secret (AppSecret): signs HTTP callbacks, gets access tokens."
    )
    mode: Literal["stream", "http"] = Field(
        "stream", description="stream (outbound WebSocket, no public URL) or http (POST /channels/dingtalk)."
    )
    api_base: str = Field("https://api.dingtalk.com", description="DingTalk OpenAPI base URL.")
    oapi_base: str = Field(
        "https://oapi.dingtalk.com",
        description="The old OpenAPI's base URL (media/upload, for images and files in replies).",
    )
    robot_code: str | None = Field(
        None, description="robotCode for the robot send API; defaults to the Client ID."
    )
    use_session_webhook: bool = Field(
        True, description="Reply through the message's sessionWebhook while it is valid."
    )
    max_message_chars: int = Field(
        5000, ge=100, le=20_000, description="Longer replies are split into several messages."
    )
    timestamp_tolerance_seconds: int = Field(
        3600, description="HTTP callbacks signed longer ago (DingTalk: 1 hour) are refused."
    )
    request_timeout_seconds: float = Field(15, description="Timeout of OpenAPI calls.")
    # Robot messages cannot be edited: no `edit`; `native` is the streaming AI card.
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset({StreamingMode.OFF, StreamingMode.NATIVE})
    streaming: StreamingMode = Field(
        StreamingMode.OFF,
        description="off (one message at the end) or native (an AI card updated in place; needs "
        "DINGTALK_CARD_TEMPLATE_ID). Robot messages cannot be edited, so there is no edit mode.",
    )
    card_template_id: str | None = Field(
        None, description="AI card template id (developer console → card platform), for streaming=native."
    )
    card_content_key: str = Field(
        "content", description="The template's streaming variable that shows the answer."
    )
    approval_card_template_id: str | None = Field(
        None,
        description="Card template with approve/deny buttons for approval prompts (docs/events.md); "
        "Stream mode only. Empty: prompts are text and approvals are typed (/approve N).",
    )

    @model_validator(mode="after")
    def _card_for_native(self) -> DingTalkSettings:
        if self.streaming is StreamingMode.NATIVE and not self.card_template_id:
            raise ValueError(
                "DINGTALK_STREAMING=native needs DINGTALK_CARD_TEMPLATE_ID (an AI card template)"
            )
        return self
