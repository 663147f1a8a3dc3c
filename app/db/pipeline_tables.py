"""The pipeline's tables: session keys and their sessions and messages, the inbox, the
outbox, runs, connection leases, channel records, stream previews and pacing buckets.

Import them from `app.db.models` (the one schema); this module is one part of it.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from app.db.base import Id, UTCDateTime, metadata

session_keys = Table(
    "session_keys",
    metadata,
    Column("key", String(512), primary_key=True),
    Column("current_session_id", Id, nullable=True),
    Column("lease_owner", String(200), nullable=True),
    Column("lease_fence", BigInteger, nullable=False, default=0),
    Column("lease_expires_at", UTCDateTime, nullable=True),
    # Some replica's session bus LISTENs for the key until then (`app.pg_bus`).
    Column("watched_until", UTCDateTime, nullable=True),
)


# One row per long-lived platform connection (`app.connection_leases`): who holds it.
connection_leases = Table(
    "connection_leases",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("owner", String(200), nullable=True),
    Column("fence", BigInteger, nullable=False, default=0),
    Column("expires_at", UTCDateTime, nullable=True),
    Column("acquired_at", UTCDateTime, nullable=True),
    Column("takeovers", BigInteger, nullable=False, default=0),
    # What a holder keeps for the next one (a Discord Gateway session to RESUME): JSON.
    Column("state", JSON, nullable=True),
)


# Small records a channel keeps for itself (`app.channel_records`): A2A push configs.
channel_records = Table(
    "channel_records",
    metadata,
    Column("channel", String(64), primary_key=True),
    Column("kind", String(64), primary_key=True),
    Column("key", String(400), primary_key=True),
    Column("owner", String(200), nullable=True),
    Column("data", JSON, nullable=False),
    Column("open", Boolean, nullable=False, default=True),  # still watched (a task not finished)
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Index("ix_channel_records_open", "channel", "kind", "open"),
)


sessions = Table(
    "sessions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("key", String(512), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("channel", String(64), nullable=False),
    Column("status", String(16), nullable=False, default="active"),
    Column("last_consolidated", BigInteger, nullable=False, default=0),
    Column("next_seq", BigInteger, nullable=False, default=1),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("last_active_at", UTCDateTime, nullable=False),
    Column("closed_at", UTCDateTime, nullable=True),
    Column("title", String(200), nullable=True),
    Column("metadata", JSON, nullable=False, default=dict),
    UniqueConstraint("key", "generation"),
    Index("ix_sessions_status_last_active", "status", "last_active_at"),
)


messages = Table(
    "messages",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("session_id", Id, ForeignKey("sessions.id"), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("role", String(16), nullable=False),
    Column("content", Text, nullable=True),
    Column("parts", JSON, nullable=True),
    Column("tool_calls", JSON, nullable=True),
    Column("tool_call_id", String(200), nullable=True),
    Column("name", String(200), nullable=True),
    Column("event_id", String(64), nullable=True),
    Column("run_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("session_id", "seq"),
    Index("ix_messages_event_id", "event_id"),
)


inbox = Table(
    "inbox",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("channel", String(64), nullable=False),
    Column("external_id", String(256), nullable=True),
    Column("session_key", String(512), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="pending"),
    Column("attempts", Integer, nullable=False, default=0),
    Column("error", Text, nullable=True),
    Column("run_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # The W3C trace context of the inbox commit, continued by the turn (app.tracing).
    Column("trace_context", JSON(none_as_null=True), nullable=True),
    UniqueConstraint("channel", "external_id"),
    Index("ix_inbox_key_status_id", "session_key", "status", "id"),
    # Where work is looked for: only unfinished rows, whatever the table's history (0018).
    Index(
        "ix_inbox_unfinished",
        "session_key",
        "id",
        postgresql_where=text("status IN ('pending', 'processing')"),
        sqlite_where=text("status IN ('pending', 'processing')"),
    ),
    Index("ix_inbox_created_at", "created_at"),  # dashboard per-minute counts
)


outbox = Table(
    "outbox",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("message_id", String(64), nullable=False, unique=True),
    Column("session_key", String(512), nullable=False),
    Column("session_id", Id, nullable=True),
    Column("run_id", Id, nullable=True),
    Column("event_id", String(64), nullable=True),
    Column("channel", String(64), nullable=False),
    Column("chat_id", String(256), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="pending"),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("claimed_until", UTCDateTime, nullable=True),
    # The sender holding the claim (0031): it may take its own claim again at once.
    Column("claimed_by", String(128), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("platform_message_id", String(256), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime, nullable=True),
    # The W3C trace context of the turn, continued by the delivery (app.tracing).
    Column("trace_context", JSON(none_as_null=True), nullable=True),
    Index("ix_outbox_status_next", "status", "next_attempt_at"),
    # Due replies and the earlier undelivered one of their key (0018).
    Index(
        "ix_outbox_undelivered",
        "session_key",
        "id",
        postgresql_where=text("status IN ('pending', 'sending')"),
        sqlite_where=text("status IN ('pending', 'sending')"),
    ),
    Index("ix_outbox_run_id", "run_id"),
    Index("ix_outbox_event_id", "event_id"),  # a waiter's replies when no run is linked
    Index("ix_outbox_sent_at", "sent_at"),  # dashboard per-minute counts
)


runs = Table(
    "runs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("session_id", Id, nullable=False),
    Column("session_key", String(512), nullable=False),
    Column("event_ids", JSON, nullable=False),
    Column("provider", String(64), nullable=False),
    Column("model", String(200), nullable=True),
    Column("tool_calls", JSON, nullable=False, default=list),
    Column("iterations", Integer, nullable=False, default=0),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("duration_ms", Integer, nullable=True),
    Column("outcome", String(32), nullable=False, default="running"),
    Column("error", Text, nullable=True),
    Column("details", JSON, nullable=False, default=dict),
    Index("ix_runs_session_id", "session_id"),
    Index("ix_runs_started_at", "started_at"),  # dashboard per-minute counts and durations
)


# A streamed reply's preview message on its platform (`app.streaming`): kept so that the
# final answer becomes the preview's last edit, in this process or after a restart.
stream_previews = Table(
    "stream_previews",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False, unique=True),  # the event being answered
    Column("channel", String(64), nullable=False),
    Column("chat_id", String(256), nullable=False),
    Column("platform_message_id", String(256), nullable=False),
    # The outbox message that completed the preview; NULL while it is a preview.
    Column("final_message_id", String(64), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Index("ix_stream_previews_created_at", "created_at"),  # retention
)


# Outbound pacing (`app.pipeline.pacing`): one row per token bucket (a bot, a chat, a
# group of a channel), shared by every replica. Times are unix seconds: the next send the
# bucket allows, the end of a platform's `retry_after` pause, and until when a final
# answer waits for it (previews yield to it).
pacing_buckets = Table(
    "pacing_buckets",
    metadata,
    Column("name", String(700), primary_key=True),  # channel:scope:chat
    Column("next_free", Float, nullable=False),
    Column("paused_until", Float, nullable=False),
    Column("finals_waiting_until", Float, nullable=False),
    # A final answer to this chat is in flight until answered (or this time lapses).
    Column("sending_until", Float, nullable=False, server_default="0"),
)
