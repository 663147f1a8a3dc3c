"""Service-wide settings (pydantic-settings).

Nothing reads the environment at import time: `Settings()` reads it when called, and
tests build `Settings(...)` with their own values. Per-channel settings live in each
channel package (`ChannelSettings` subclasses with an env prefix per channel).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.pacing_limits import parse_limits
from app.usage_settings import Budget, ModelPrice


class GatewayTokenSpec(BaseModel):
    """A static browser-gateway token (`GATEWAY_TOKENS`, a JSON list of these)."""

    token: str = Field(min_length=16)
    subject: str = Field(min_length=1, max_length=200)
    session_keys: list[str] = Field(default_factory=list)
    key_prefix: str | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    # --- storage -----------------------------------------------------------------------
    database_url: str = Field(
        "sqlite+aiosqlite:///./chatgate.db",
        description="SQLAlchemy URL; postgresql://… is used through asyncpg.",
    )
    db_pool_size: int = Field(
        20, description="Connections per process at most (PostgreSQL); opened as needed, then kept."
    )
    bus_database_url: str | None = Field(
        None,
        description="PostgreSQL URL of the session bus (LISTEN/NOTIFY across replicas); unset: "
        "DATABASE_URL. Behind a pooler in transaction mode, a direct connection to the primary.",
    )
    database_pooler: Literal["none", "pgbouncer"] = Field(
        "none",
        description="pgbouncer: DATABASE_URL goes through PgBouncer in transaction mode, so no "
        "named prepared statements on pooled connections (docs/operations.md).",
    )
    db_connect_timeout_seconds: float = Field(
        10.0, gt=0, description="A connection attempt to the database gives up after this."
    )
    db_outage_retry_after_seconds: int = Field(
        5, ge=1, description="Retry-After of the 503 answered while the database cannot be reached."
    )
    auto_migrate: bool = Field(True, description="Run migrations to head at start-up.")
    db_connect_retry_seconds: float = Field(
        30.0, description="How long start-up waits for the database to accept connections."
    )

    # --- HTTP ------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `chatgate serve` binds to.")
    port: int = Field(8000, description="Port `chatgate serve` binds to.")
    admin_token: str | None = Field(None, description="Bearer token of /admin/api; unset disables it.")
    admin_max_failures: int = Field(
        10, description="Wrong admin tokens from one client address before it is locked out."
    )
    admin_lockout_seconds: float = Field(
        60.0, description="How long such a client gets 429 (counted over the same period)."
    )
    public_base_url: str | None = Field(
        None, description="External URL of this service, used when registering webhooks."
    )
    max_body_bytes: int = Field(
        1024 * 1024, ge=1, description="Largest request body on any route; larger ones get 413."
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated proxy addresses whose X-Forwarded-For is believed; empty: none.",
    )
    media_allow_private_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated host names, addresses or networks (192.168.1.0/24) that URLs from "
        "payloads may reach although private or loopback (e.g. a OneBot bridge serving files on the LAN); "
        "empty: none (docs/security.md).",
    )

    channels: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["webhook"],
        description="Comma-separated channels to serve (webhook, telegram, slack, wecom, "
        "wechat-mp, onebot, qq, feishu, dingtalk, cron).",
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
    offline_stream_delay_ms: int = Field(
        40, ge=0, description="Pause between the offline provider's streamed pieces (0: no pause)."
    )
    system_prompt: str = "You are chatgate, a helpful assistant. Answer concisely."
    agent_max_iterations: int = Field(8, description="Model calls per turn before giving up.")
    llm_max_retries: int = Field(3, description="Retries of a model call on 429/5xx/connection errors.")
    llm_backoff_base_seconds: float = Field(0.5, description="First retry delay; doubles each try.")
    llm_backoff_max_seconds: float = Field(
        30.0, description="Longest wait between retries (Retry-After too)."
    )
    llm_stream: bool = Field(True, description="Stream answers (deltas reach browser clients).")
    llm_vision: bool = Field(False, description="The model reads images: send image parts as image_url.")
    stt_model: str | None = Field(
        None, description="Speech-to-text model for voice messages (audio/transcriptions); unset: off."
    )
    stt_base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint for STT; default LLM_BASE_URL."
    )
    llm_fallback_base_url: str | None = Field(None, description="Endpoint tried when the primary gave up.")
    llm_fallback_api_key: str | None = None
    agents_file: str | None = Field(
        None, description="YAML or TOML file of agents and routes (docs/agents.md); unset: one agent."
    )
    skills_dir: str | None = Field(
        None, description="Folder of skills (one sub-folder with a SKILL.md each); unset: none."
    )
    llm_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated further models a session may choose with /model "
        "(the channel's model is always allowed).",
    )
    llm_fallback_model: str | None = Field(None, description="Model of the fallback endpoint.")
    usage_currency: str = Field(
        "USD",
        min_length=3,
        max_length=8,
        description="Currency of costs. The built-in price table (genai-prices) is in USD; with "
        "another currency, give every model's price in USAGE_PRICES.",
    )
    usage_prices: Annotated[dict[str, ModelPrice], NoDecode] = Field(
        default_factory=dict,
        description='Own prices per million tokens, winning over the table: {"model": {"input": 0.15, '
        '"output": 0.6, "cached": 0.075}}.',
    )
    usage_budgets: Annotated[list[Budget], NoDecode] = Field(
        default_factory=list,
        description='Limits checked before each model call (docs/usage.md): [{"scope": "sender", '
        '"period": "day", "tokens": 200000}, {"scope": "deployment", "period": "month", "cost": 50}].',
    )
    llm_context_tokens: int = Field(
        128_000, ge=256, description="Context window of the models in tokens: no request exceeds it."
    )
    llm_context_tokens_by_model: Annotated[dict[str, int], NoDecode] = Field(
        default_factory=dict,
        description="Per-model context windows, comma-separated MODEL=TOKENS (e.g. llama3=8192).",
    )
    llm_reply_tokens: int = Field(4096, ge=0, description="Tokens of the context left free for the answer.")
    tool_result_max_chars: int = Field(
        16_000,
        description="Longer tool results are cut with a marker before they reach history or the model.",
    )
    llm_answer_max_chars: int = Field(
        200_000, ge=1000, description="A longer model answer is cut (the stream is closed) with a marker."
    )
    stop_poll_seconds: float = Field(1.0, description="How often a run looks for /stop from other replicas.")

    # --- tools -----------------------------------------------------------------------
    tools_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tool names/globs offered; empty allows all."
    )
    tools_deny: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tool names/globs never offered."
    )
    workspace_root: str | None = Field(
        None,
        description="Directory the file tools may touch; unset disables read_file/list_files/write_file.",
    )
    workspace_per_session: bool = Field(
        False,
        description="Give each session its own directory WORKSPACE_ROOT/<agent>/<key>/<generation> "
        "for the file tools.",
    )
    send_file_max_bytes: int = Field(
        10_000_000,
        ge=1,
        description="Largest workspace file the send_file tool attaches to an answer (with WORKSPACE_ROOT).",
    )
    workspace_cleanup: Literal["keep", "remove", "archive"] = Field(
        "remove",
        description="With per-session workspaces: what the lifecycle sweep does with the directory "
        "of an expired or archived session (archive: move it under WORKSPACE_ROOT/.archive).",
    )
    approval_timeout_seconds: float = Field(
        300.0, description="A pending /approve request is denied after this."
    )
    approval_sweep_seconds: float = Field(5.0, description="How often timed-out approvals are looked for.")

    # --- sessions --------------------------------------------------------------------
    history_max_messages: int = Field(100, description="Newest messages sent to the model.")
    history_max_tokens: int | None = Field(None, description="Optional token budget of the window.")
    suspend_after_seconds: float = 30 * 60
    expire_after_seconds: float = 24 * 3600
    archive_after_seconds: float = 7 * 24 * 3600
    session_cache_size: int = Field(1024, description="Sessions kept in the in-memory LRU.")
    lifecycle_sweep_seconds: float = Field(60.0, description="How often idle sessions are swept.")
    session_heartbeat_seconds: float = Field(
        30.0, description="While a run works, its session's last-active time is refreshed this often."
    )

    # --- pipeline --------------------------------------------------------------------
    worker_id: str | None = Field(None, description="Lease owner name; default host:pid:random.")
    max_concurrent_runs: int = Field(16, description="Agent runs at once in this process.")
    lease_ttl_seconds: float = Field(30.0, description="A dead worker's keys are free after this.")
    connection_lease_ttl_seconds: float = Field(
        30.0,
        description="A long-lived platform connection (polling, Socket Mode, Gateway, Stream) of a dead "
        "replica is taken over by another within this.",
    )
    inbox_poll_seconds: float = Field(1.0, description="How often pending inbox rows are polled.")
    max_event_attempts: int = Field(3, description="Processing attempts before an event fails.")
    collect_debounce_seconds: float = Field(0.5, description="Wait of the `collect` busy policy.")
    pipeline_store: Literal["auto", "portable"] = Field(
        "auto",
        description="auto: PostgreSQL's single-statement store on PostgreSQL, SQLite's "
        "one-hop-per-transaction store on a SQLite file; portable: plain SQLAlchemy "
        "transactions everywhere (for comparisons; slower on both).",
    )
    outbox_poll_seconds: float = 0.5
    outbox_max_attempts: int = 8
    outbox_claim_seconds: float = Field(
        30.0,
        description="A delivery claimed by a replica that died is retried after this or LEASE_TTL_SECONDS, "
        "whichever is shorter (a delivery in flight renews its claim).",
    )
    shutdown_grace_seconds: float = Field(
        20.0,
        description="On SIGTERM, turns in flight get this long to finish before their sessions are "
        "handed to another replica (docs/operations.md).",
    )
    outbox_backoff_base_seconds: float = 1.0
    # --- outbound pacing (`app.pipeline.pacing`; docs/operations.md "Pacing")
    pacing_enabled: bool = Field(
        True,
        description="Send replies and previews within each platform's rate limits, counted in the "
        "database so every replica shares the same budget.",
    )
    pacing_limits: str = Field(
        "",
        description="Overrides of the per-platform limits: channel.scope=count/seconds, comma-separated "
        "(scope: bot, chat, group, or card for streaming-card edits; `off` drops one), "
        "e.g. `telegram.group=20/60,slack.chat=1/1`.",
    )
    pacing_max_wait_seconds: float = Field(
        1.0,
        description="A reply whose slot is further away goes back to the outbox until then, so one "
        "chat over its budget never holds up the others.",
    )
    # --- end outbound pacing
    # --- streaming previews on chat platforms (`app.streaming`; <CHANNEL>_STREAMING)
    stream_first_preview_seconds: float = Field(
        1.0, description="A turn answered sooner shows no preview, only a typing state."
    )
    stream_still_working_seconds: float = Field(
        15.0, description="A turn running longer with nothing to show says it is still working."
    )
    # --- end streaming previews
    outbox_backoff_max_seconds: float = 300.0
    inbox_retention_days: float = Field(
        14.0,
        description="Finished inbox events are deleted after this many days (0 keeps them); a "
        "redelivery older than this is no longer recognised as a duplicate.",
    )
    outbox_retention_days: float = Field(
        14.0, description="Sent or failed outbox rows are deleted after this many days (0 keeps them)."
    )

    # --- memory (app.memory) -----------------------------------------------------------
    memory_enabled: bool = Field(True, description="Recall memory into runs and offer remember/recall.")
    memory_global_file: str | None = Field(
        None, description="Text file of operator facts for every session, one per line (# comments)."
    )
    memory_recall_max_items: int = Field(12, description="Memories recalled per scope into a run.")
    memory_recall_max_chars: int = Field(4000, description="Upper bound of recalled memory text per run.")
    memory_user_recall_in_shared_groups: bool = Field(
        False,
        description="Recall all of the sender's personal memory in group sessions shared by several "
        "members (chat/thread scope); off: only entries stored as shareable. user_in_chat "
        "sessions and DMs always recall it.",
    )
    consolidation_enabled: bool = Field(True, description="Summarize long sessions into memory.")
    consolidation_threshold_messages: int = Field(
        80, description="Consolidate when this many messages are past last_consolidated."
    )
    consolidation_threshold_tokens: int = Field(
        12000, description="… or when they are estimated at this many tokens."
    )
    consolidation_keep_messages: int = Field(
        20, description="Newest messages left unconsolidated (the model still sees them verbatim)."
    )
    consolidation_summary_max_chars: int = Field(2000, description="Upper bound of one summary.")

    # --- MCP (app.agent.mcp) -----------------------------------------------------------
    mcp_servers: Annotated[list[dict[str, Any]], NoDecode] = Field(
        default_factory=list,
        description='JSON list: [{"name": "fs", "command": ["npx", "…"]}, {"name": "x", "url": '
        '"http://…/mcp", "trusted": false}]; see docs/mcp.md.',
    )
    mcp_call_timeout_seconds: float = Field(60.0, description="Upper bound of one MCP tool call.")
    mcp_connect_timeout_seconds: float = Field(15.0, description="Upper bound of connecting to a server.")
    mcp_result_max_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="An MCP answer is read up to this many bytes; a larger one is a tool error, unread.",
    )

    # --- browser gateway (WS /ws; docs/gateway.md) -------------------------------------
    gateway_tokens: list[GatewayTokenSpec] = Field(
        default_factory=list,
        description='Static gateway tokens, JSON: [{"token", "subject", "session_keys", "key_prefix"}].',
    )
    gateway_token_secret: str | None = Field(
        None, description="HMAC key of short-lived gateway tokens; unset disables issuing them."
    )
    gateway_token_ttl_seconds: int = Field(3600, description="Default lifetime of issued gateway tokens.")
    gateway_token_max_ttl_seconds: int = Field(86400, description="Upper bound of an issued token lifetime.")
    gateway_auth_timeout_seconds: float = Field(10.0, description="Time a client has to send `auth`.")
    gateway_heartbeat_seconds: float = Field(20.0, description="Interval of heartbeat frames.")
    gateway_idle_timeout_seconds: float = Field(120.0, description="Close after this long without a frame.")
    gateway_send_queue_size: int = Field(256, description="Frames a client may fall behind before 4008.")
    gateway_send_timeout_seconds: float = Field(10.0, description="One send taking longer closes with 4008.")
    gateway_history_limit: int = Field(50, description="Messages sent on attach without last_seq.")
    gateway_resume_limit: int = Field(1000, description="Most missed messages sent on a resume.")
    gateway_max_text_chars: int = Field(32_000, description="Longest text of a `send` frame.")
    gateway_max_frame_bytes: int = Field(65_536, description="Largest client frame.")
    gateway_sends_per_minute: int = Field(
        30, ge=1, description="Messages one connection may send per minute; more get error `rate_limited`."
    )
    gateway_subject_sends_per_minute: int = Field(
        60, ge=1, description="Messages one subject may send per minute over all its connections."
    )

    # --- logging ---------------------------------------------------------------------
    log_level: str = "INFO"
    log_format: Literal["json", "console"] = "json"

    @field_validator(
        "channels",
        "tools_allow",
        "tools_deny",
        "trusted_proxies",
        "llm_models",
        "media_allow_private_hosts",
        mode="before",
    )
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("llm_context_tokens_by_model", mode="before")
    @classmethod
    def _model_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            pairs = [p.strip().rpartition("=") for p in value.split(",") if p.strip()]
            if any(not model.strip() or not tokens.strip().isdigit() for model, _, tokens in pairs):
                raise ValueError("LLM_CONTEXT_TOKENS_BY_MODEL: MODEL=TOKENS pairs, comma-separated")
            return {model.strip(): int(tokens) for model, _, tokens in pairs}
        return value

    @field_validator("pacing_limits")
    @classmethod
    def _pacing_limits(cls, value: str) -> str:
        parse_limits(value)  # a typo fails at start-up, not at the first send
        return value

    @field_validator("mcp_servers", mode="before")
    @classmethod
    def _json_list(cls, value: object) -> object:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else []
        return value

    @field_validator("gateway_tokens", mode="before")
    @classmethod
    def _json_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else []
        return value

    @field_validator("database_url", "bus_database_url")
    @classmethod
    def _async_driver(cls, url: str | None) -> str | None:
        if url is None:
            return None
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

    @property
    def bus_url(self) -> str:
        """Where the session bus connects: `BUS_DATABASE_URL`, else `DATABASE_URL`."""
        return self.bus_database_url or self.database_url
