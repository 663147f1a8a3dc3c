"""Settings of the Feishu/Lark channel (`FEISHU_…`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings


class FeishuSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="FEISHU_", env_file=".env", extra="ignore")
    deletes_messages: ClassVar[bool] = True  # DELETE /im/v1/messages/{id} (docs/events.md)

    app_id: str | None = Field(None, description="App ID (cli_…), Credentials & Basic Info.")
    app_secret: str | None = Field(None, description="App Secret, for the tenant access token.")
    verification_token: str | None = Field(
        None, description="Verification Token (Events & Callbacks → Encryption Strategy)."
    )
    encrypt_key: str | None = Field(
        None, description="Encrypt Key (same page); set it to get encrypted and signed callbacks."
    )
    api_base: str = Field(
        "https://open.feishu.cn", description="Open API base URL; Lark is https://open.larksuite.com."
    )
    bot_open_id: str | None = Field(
        None, description="The bot's open_id (ou_…), to find mentions; asked with bot/v3/info when unset."
    )
    reply_to_message: bool = Field(
        True, description="In groups answer as a reply to the message (in its thread when it has one)."
    )
    reply_in_thread: bool = Field(
        False, description="In groups answer in a thread under the message (its id becomes the thread)."
    )
    max_message_bytes: int = Field(
        100_000,
        ge=1000,
        le=150_000,
        description="Longer replies are split (measured as sent; Feishu refuses text bodies over 150 KB).",
    )
    timestamp_tolerance_seconds: int = Field(
        300, description="Signed callbacks further from server time are refused; 0 disables the check."
    )
    token_refresh_margin_seconds: float = Field(
        1800.0, description="Fetch a new tenant access token this long before the cached one expires."
    )
    rate_limit_retry_seconds: float = Field(
        1.0, description="Wait after a rate-limit answer that says nothing about how long."
    )
    request_timeout_seconds: float = Field(15.0, description="Timeout of Open API calls.")
    stream_edit_seconds: float = Field(
        1.5,
        ge=0.05,
        description="Least time between two edits of a preview (Feishu allows 20 edits of one message; "
        "the last is kept for the answer).",
    )
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset(
        {StreamingMode.OFF, StreamingMode.EDIT, StreamingMode.NATIVE}
    )
    streaming: StreamingMode = Field(
        StreamingMode.EDIT,
        description="off (one message at the end), edit (a text message edited in place, at most 20 "
        "times), native (a streaming card, CardKit: needs the cardkit:card:write scope; without it "
        "the preview falls back to edit).",
    )
    card_streaming_seconds: float = Field(
        540.0,
        ge=1,
        le=600,
        description="streaming=native: the card is updated while the turn runs for at most this long "
        "(Feishu closes a card's streaming mode after 10 minutes); the answer then replaces the card.",
    )
