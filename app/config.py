"""Service-wide settings (pydantic-settings).

Nothing reads the environment at import time: `Settings()` reads it when called, and
tests build `Settings(...)` with their own values. Per-channel settings live in each
channel package (`ChannelSettings` subclasses with an env prefix per channel).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    # --- storage -----------------------------------------------------------------------
    database_url: str = Field(
        "sqlite+aiosqlite:///./chatgate.db",
        description="SQLAlchemy URL; postgresql://… is used through asyncpg.",
    )
    db_pool_size: int = Field(10, description="Connections per process (PostgreSQL).")
    auto_migrate: bool = Field(True, description="Run migrations to head at start-up.")

    # --- HTTP ------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `chatgate serve` binds to.")
    port: int = Field(8000, description="Port `chatgate serve` binds to.")
    admin_token: str | None = Field(None, description="Bearer token of /admin/api; unset disables it.")
    public_base_url: str | None = Field(
        None, description="External URL of this service, used when registering webhooks."
    )

    channels: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["webhook"],
        description="Comma-separated channels to serve (webhook, telegram, slack, wecom, "
        "wechat-mp, onebot, qq, cron).",
    )

    # --- model -----------------------------------------------------------------------
    llm_provider: Literal["offline", "openai"] = "offline"
    llm_base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. …/v1.")
    llm_api_key: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_timeout_seconds: float = 60.0
    offline_latency_ms: int = Field(
        0, description="Simulated model latency of the offline provider (demos, benchmarks)."
    )
    system_prompt: str = "You are chatgate, a helpful assistant. Answer concisely."
    agent_max_iterations: int = Field(8, description="Model calls per turn before giving up.")

    # --- sessions --------------------------------------------------------------------
    history_max_messages: int = Field(100, description="Newest messages sent to the model.")
    history_max_tokens: int | None = Field(None, description="Optional token budget of the window.")
    suspend_after_seconds: float = 30 * 60
    expire_after_seconds: float = 24 * 3600
    archive_after_seconds: float = 7 * 24 * 3600
    session_cache_size: int = Field(1024, description="Sessions kept in the in-memory LRU.")
    lifecycle_sweep_seconds: float = Field(60.0, description="How often idle sessions are swept.")

    # --- pipeline --------------------------------------------------------------------
    worker_id: str | None = Field(None, description="Lease owner name; default host:pid:random.")
    max_concurrent_runs: int = Field(16, description="Agent runs at once in this process.")
    lease_ttl_seconds: float = Field(30.0, description="A dead worker's keys are free after this.")
    inbox_poll_seconds: float = Field(1.0, description="How often pending inbox rows are polled.")
    max_event_attempts: int = Field(3, description="Processing attempts before an event fails.")
    collect_debounce_seconds: float = Field(0.5, description="Wait of the `collect` busy policy.")
    outbox_poll_seconds: float = 0.5
    outbox_max_attempts: int = 8
    outbox_backoff_base_seconds: float = 1.0
    outbox_backoff_max_seconds: float = 300.0

    # --- logging ---------------------------------------------------------------------
    log_level: str = "INFO"
    log_format: Literal["json", "console"] = "json"

    @field_validator("channels", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, url: str) -> str:
        if url.startswith("postgres://"):
            url = "postgresql://" + url[len("postgres://") :]
        if url.startswith("postgresql://"):
            return "postgresql+asyncpg://" + url[len("postgresql://") :]
        if url.startswith("sqlite:///"):
            return "sqlite+aiosqlite:///" + url[len("sqlite:///") :]
        return url

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
