"""Tables (SQLAlchemy Core). One schema for PostgreSQL and SQLite.

The hot paths (inbox, history appends, leases) use Core statements rather than the ORM:
they are a handful of fixed queries and the ORM's unit of work would only add cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only auto-increments an INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer, "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both backends (SQLite stores naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# Rows still owed work: unfinished inbox events, undelivered outbox replies.
INBOX_UNFINISHED = ("pending", "processing")
# An inbox row canceled while it was pending (A2A tasks/cancel): finished, never run.
CANCELED = "canceled"
OUTBOX_UNDELIVERED = ("pending", "sending")


def one_of(column: ColumnElement[Any], values: Iterable[Any]) -> ColumnElement[bool]:
    """`column IN (values)` with one bound parameter per value, fixed in the cached SQL.

    `column.in_(values)` binds the list as one "expanding" parameter instead, which
    SQLAlchemy renders into the statement's text anew on every execution: measurable on
    statements that run for every event.
    """
    return column.in_([literal(v, column.type) for v in values])


def utcnow() -> datetime:
    return datetime.now(UTC)


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
    Index("ix_inbox_status_id", "status", "id"),
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
    Column("last_error", Text, nullable=True),
    Column("platform_message_id", String(256), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("sent_at", UTCDateTime, nullable=True),
    # The W3C trace context of the turn, continued by the delivery (app.tracing).
    Column("trace_context", JSON(none_as_null=True), nullable=True),
    Index("ix_outbox_status_next", "status", "next_attempt_at"),
    Index("ix_outbox_key_id", "session_key", "id"),
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

# The agent a conversation switched to with /agent (app.agents): keyed by the session key
# the conversation has without an agent; routes decide when there is no row.
agent_choices = Table(
    "agent_choices",
    metadata,
    Column("key", String(512), primary_key=True),
    Column("agent", String(100), nullable=False),
    Column("chosen_by", String(256), nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# One-time codes of /link (app.agents.links): who asked, until when. Only a hash is kept.
link_codes = Table(
    "link_codes",
    metadata,
    Column("code_hash", String(64), primary_key=True),
    Column("identity", String(600), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
)

# /handoff (app.agents.handoff): a linked identity's direct chat continues another session.
handoffs = Table(
    "handoffs",
    metadata,
    Column("from_key", String(512), primary_key=True),  # the direct chat's own key
    Column("to_key", String(512), nullable=False),  # the session it continues
    Column("identity", String(600), nullable=False),  # whose chat: only they are redirected
    Column("created_at", UTCDateTime, nullable=False),
    # Where /handoff was sent ({channel, chat_id, thread_id, identity}) and the direct chat it
    # went to ({channel, chat_id}): the addresses of its notices (app.agents.handoff).
    Column("origin", JSON, nullable=True),
    Column("target", JSON, nullable=True),
    Index("ix_handoffs_to_key", "to_key"),
)

# Who spoke in which conversation (app.agents.senders): one row per session key and sender
# identity, written when the first of its events was accepted; /sessions across chats.
session_senders = Table(
    "session_senders",
    metadata,
    Column("key", String(512), primary_key=True),
    Column("identity", String(600), primary_key=True),
    Column("channel", String(64), nullable=False),
    Column("chat_id", String(512), nullable=False),
    Column("first_at", UTCDateTime, nullable=False),
    Index("ix_session_senders_identity", "identity"),
)

memories = Table(
    "memories",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    # user: owner is a person's identity; session: owner is a session key; global: "".
    Column("scope", String(16), nullable=False),
    Column("owner", String(512), nullable=False),
    Column("key", String(200), nullable=True),
    Column("content", Text, nullable=False),
    Column("source_session_id", Id, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("metadata", JSON, nullable=False, default=dict),
    # An agent's memory_namespace (app.agents): "" is the default, shared namespace.
    Column("namespace", String(100), nullable=False, default="", server_default=""),
    Index("ix_memories_scope_owner", "scope", "owner"),
    # app.memory always sets `key`, so one fact/note/summary is stored once per owner and namespace.
    Index("uq_memories_scope_owner_ns_key", "scope", "owner", "namespace", "key", unique=True),
)

identity_links = Table(
    "identity_links",
    metadata,
    # A channel identity ("telegram:42", components escaped like session keys) belongs to
    # one person; user memory of linked identities is shared (app.memory.identity).
    Column("identity", String(600), primary_key=True),
    Column("person_id", String(200), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(256), nullable=True),
    Index("ix_identity_links_person_id", "person_id"),
)

approvals = Table(
    "approvals",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("session_id", Id, nullable=False),
    Column("session_key", String(512), nullable=False),
    Column("run_id", Id, nullable=True),
    Column("tool_call_id", String(200), nullable=False),
    Column("tool_name", String(200), nullable=False),
    Column("arguments", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="pending"),
    Column("requested_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("decided_at", UTCDateTime, nullable=True),
    Column("decided_by", String(256), nullable=True),
    Index("ix_approvals_key_status", "session_key", "status"),
)

cron_jobs = Table(
    "cron_jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    # A cron expression, or NULL for a one-shot job that fires once at `run_at`.
    Column("schedule", String(200), nullable=True),
    Column("timezone", String(64), nullable=False, default="UTC"),
    Column("prompt", Text, nullable=False),
    Column("source_session_key", String(512), nullable=False),
    Column("target_channel", String(64), nullable=False),
    Column("target_chat_id", String(256), nullable=False),
    Column("target_thread_id", String(256), nullable=True),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("next_fire_at", UTCDateTime, nullable=True),
    Column("last_fired_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("created_by", String(256), nullable=True),
    Column("metadata", JSON, nullable=False, default=dict),
    Column("run_at", UTCDateTime, nullable=True),
    Column("max_runs", Integer, nullable=True),
    Column("runs", Integer, nullable=False, default=0, server_default="0"),
    Column("last_error", Text, nullable=True),
    Column("updated_at", UTCDateTime, nullable=True),
    Index("ix_cron_jobs_enabled_next", "enabled", "next_fire_at"),
    Index("ix_cron_jobs_source_session_key", "source_session_key"),
)

# Wrong admin tokens per client address, shared by every replica: a fixed window opened
# by the first failure; `failures` counts within it (`app.web.admin_auth.AdminLockout`).
admin_auth_failures = Table(
    "admin_auth_failures",
    metadata,
    Column("client", String(64), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("window_start", Float, nullable=False),  # unix seconds
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

# Who may talk to the bot (`app.access`): senders and group chats allowed at runtime, on
# top of each channel's static `allowed_senders`/`allowed_chats`.
access_entries = Table(
    "access_entries",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("channel", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # sender | chat
    Column("subject", String(256), nullable=False),  # the sender's or chat's platform id
    Column("note", String(200), nullable=True),
    Column("added_by", String(256), nullable=True),  # cli, admin, pairing:<code>
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("channel", "kind", "subject"),
)

# Pairing requests: one row per (channel, sender); a pending code is single-use and expires.
access_pairings = Table(
    "access_pairings",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("channel", String(64), nullable=False),
    Column("sender_id", String(256), nullable=False),
    Column("chat_id", String(256), nullable=False),
    Column("code", String(16), nullable=False, unique=True),
    Column("status", String(16), nullable=False),  # pending | approved
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("approved_at", UTCDateTime, nullable=True),
    Column("approved_by", String(256), nullable=True),
    Column("text", String(200), nullable=True),  # the first words of the message that asked
    UniqueConstraint("channel", "sender_id"),
    Index("ix_access_pairings_status_expires_at", "status", "expires_at"),
)

# Quota counters shared by every replica: one row per (metric, subject), a fixed window
# (unix seconds of its start) that an increment in a later window restarts.
access_counters = Table(
    "access_counters",
    metadata,
    Column("metric", String(16), primary_key=True),  # messages | tokens
    Column("subject", String(800), primary_key=True),  # sender:…, agent_sender:…, session:…
    Column("window_start", BigInteger, nullable=False),
    Column("count", BigInteger, nullable=False),
    Column("notified", Boolean, nullable=False),  # the over-quota reply went out this window
    Index("ix_access_counters_window_start", "window_start"),
)
