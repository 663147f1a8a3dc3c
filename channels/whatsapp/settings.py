"""Settings of the WhatsApp Cloud API channel (`WHATSAPP_…`)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from channels.common.media import MediaSettings
from channels.common.progress import check_streaming


class WhatsAppSettings(MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="WHATSAPP_", env_file=".env", extra="ignore")

    app_secret: str | None = Field(
        None, description="The Meta app's secret: every webhook is signed with it (X-Hub-Signature-256)."
    )
    verify_token: str | None = Field(
        None, description="The token you typed into the app's webhook settings (hub.verify_token)."
    )
    access_token: str | None = Field(
        None, description="A system user's access token with whatsapp_business_messaging."
    )
    phone_number_id: str | None = Field(
        None, description="The business phone number's id (not the number itself); answers are sent from it."
    )
    graph_base_url: str = Field("https://graph.facebook.com", description="Graph API base URL.")
    graph_version: str = Field("v24.0", description="Graph API version in the request paths.")
    api_timeout_seconds: float = Field(15.0, gt=0, description="Timeout of one Graph API request.")
    max_text_chars: int = Field(4096, ge=1, description="Longer answers are sent as several messages.")
    window_hours: float = Field(
        24.0,
        gt=0,
        description="The customer-service window: free-form answers only this long after the user's "
        "last message.",
    )
    template_name: str | None = Field(
        None,
        description="An approved message template sent instead of an answer outside the window; "
        "unset: such answers are not sent (recorded with the reason).",
    )
    template_language: str = Field("en_US", description="The template's language code.")
    streaming: StreamingMode = Field(
        StreamingMode.NATIVE,
        description="native: the typing indicator while a turn runs (it also marks the user's "
        "message read); off: none. No previews: WhatsApp cannot edit a sent message.",
    )
    working_notice_seconds: float | None = Field(
        None, gt=0, description="Send one short 'working…' notice when a turn runs longer; unset: none."
    )

    @field_validator("streaming")
    @classmethod
    def _no_previews(cls, value: StreamingMode) -> StreamingMode:
        return check_streaming("WhatsApp", value, (StreamingMode.NATIVE, StreamingMode.OFF))

    @property
    def api_root(self) -> str:
        """`https://graph.facebook.com/v24.0`: every Graph path hangs below it."""
        return f"{self.graph_base_url.rstrip('/')}/{self.graph_version.strip('/')}"
