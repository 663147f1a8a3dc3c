"""Settings of the Matrix channel (`MATRIX_…`): a bot account on a homeserver."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.events import SessionScope
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings


class MatrixSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="MATRIX_", env_file=".env", extra="ignore")
    deletes_messages: ClassVar[bool] = True  # redaction of our answer (docs/events.md)

    homeserver_url: str | None = Field(
        None, description="The bot's homeserver, its client-server API base (https://matrix.example.org)."
    )
    access_token: str | None = Field(
        None,
        description="The bot account's access token (log in once as the bot, e.g. with Element, "
        "or `POST /_matrix/client/v3/login`; keep the device: its id scopes transaction ids).",
    )
    session_scope: SessionScope = Field(
        SessionScope.THREAD,
        description="chat (one conversation per room), thread (a Matrix thread is its own "
        "conversation; the room's main timeline is one) or user_in_chat.",
    )
    invites: Literal["all", "allowed", "none"] = Field(
        "allowed",
        description="Which room invitations the bot accepts: all, allowed (from senders allowed by "
        "MATRIX_ALLOWED_SENDERS, or into rooms listed in MATRIX_ALLOWED_CHATS; with both empty, "
        "every invitation) or none (an operator joins the bot to rooms).",
    )
    sync_timeout_seconds: float = Field(
        30.0, gt=0, le=120, description="How long one /sync long poll is held by the homeserver."
    )
    sync_retry_seconds: float = Field(2.0, ge=0, description="Wait after a failed /sync.")
    sync_timeline_limit: int = Field(
        100, ge=1, le=1000, description="Timeline events a /sync returns per room at most."
    )
    max_message_chars: int = Field(
        16000, ge=16, le=30000, description="Longer replies are split (events are limited to 64 KiB)."
    )
    request_timeout_seconds: float = Field(15.0, gt=0, description="Timeout of other API calls.")
