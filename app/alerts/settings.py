"""Settings of the gateway's own alerts (`ALERT_*`; docs/alerts.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class AlertSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ALERT_", env_file=".env", extra="ignore")

    channel: str | None = Field(
        None, description="A served channel whose chat ALERT_CHAT_ID gets the alerts (e.g. telegram)."
    )
    chat_id: str | None = Field(None, description="The operators' chat on ALERT_CHANNEL.")
    webhook_url: str | None = Field(
        None, description="POST each alert as signed JSON here (X-Chatgate-Timestamp/-Signature)."
    )
    webhook_secret: str | None = Field(None, description="HMAC-SHA256 key of the alert webhook's signature.")
    language: Literal["en", "zh"] = Field("en", description="Language of the alert texts: en or zh.")
    check_seconds: float = Field(15.0, gt=0, description="How often each replica looks for incidents.")
    outbox_age_seconds: float = Field(
        300.0, gt=0, description="An undelivered reply older than this is an incident."
    )
    dead_letter_window_seconds: float = Field(
        600.0, gt=0, description="Events failed (dead letters) within this window are an incident."
    )
    model_error_streak: int = Field(
        3, ge=1, description="This many runs in a row failing on the model is an incident."
    )
    conflict_streak: int = Field(
        3,
        ge=1,
        description="A platform refusing the connection as a conflict (Telegram's 409) this many times in "
        "a row is an incident.",
    )
    memory_mib: int = Field(0, ge=0, description="A replica's RSS above this (MiB) is an incident; 0: off.")

    @property
    def enabled(self) -> bool:
        return bool(self.webhook_url or (self.channel and self.chat_id))
