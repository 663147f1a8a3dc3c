"""Settings of the Telegram channel (`TELEGRAM_…`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings

# setWebhook's secret_token: 1-256 characters of A-Z a-z 0-9 _ - (Bot API).
_SECRET_ALPHABET = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class TelegramSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="TELEGRAM_", env_file=".env", extra="ignore")
    # native: message drafts (sendMessageDraft) in private chats (`channels.telegram.drafts`).
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset(StreamingMode)
    deletes_messages: ClassVar[bool] = True  # deleteMessage (docs/events.md)

    bot_token: str | None = Field(None, description="Bot token from @BotFather.")
    webhook_secret: str | None = Field(
        None,
        description="secret_token given to setWebhook; checked against "
        "X-Telegram-Bot-Api-Secret-Token (1-256 of A-Z a-z 0-9 _ -).",
    )
    mode: Literal["webhook", "polling"] = Field(
        "webhook", description="webhook (production) or polling (getUpdates, development only)."
    )
    api_base_url: str = Field(
        "https://api.telegram.org/bot", description="Bot API base URL; the token is appended."
    )
    file_base_url: str = Field(
        "https://api.telegram.org/file/bot", description="Bot API file base URL; the token is appended."
    )
    bot_username: str | None = Field(
        None, description="The bot's @username (without @); asked with getMe at start when unset."
    )
    bot_id: int | None = Field(None, description="The bot's user id; asked with getMe at start when unset.")
    max_message_chars: int = Field(
        4096, ge=16, le=4096, description="Longer replies are split (Telegram's limit is 4096)."
    )
    quote_in_groups: bool = Field(True, description="In groups, send the reply as a reply to the message.")
    polling_timeout_seconds: int = Field(30, ge=0, description="Long-poll timeout of getUpdates.")
    polling_retry_seconds: float = Field(5.0, description="Wait after a failed getUpdates.")
    request_timeout_seconds: float = Field(15.0, description="Timeout of Bot API calls.")
    stream_edit_seconds: float = Field(
        1.0, ge=0.05, description="Least time between two edits of a preview (Telegram: ~1/s per chat)."
    )
    draft_refresh_seconds: float = Field(
        20.0,
        ge=1.0,
        description="native streaming: a draft unchanged this long is sent again (Telegram shows a "
        "draft for about 30 s after its last update); checked with the typing state, every 4 s.",
    )

    @field_validator("webhook_secret")
    @classmethod
    def _secret_alphabet(cls, value: str | None) -> str | None:
        if value is not None and not (1 <= len(value) <= 256 and set(value) <= _SECRET_ALPHABET):
            raise ValueError("must be 1-256 characters of A-Z a-z 0-9 _ -")
        return value

    @field_validator("bot_username")
    @classmethod
    def _strip_at(cls, value: str | None) -> str | None:
        return value.lstrip("@") if value else value
