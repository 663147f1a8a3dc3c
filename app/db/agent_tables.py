"""The agents' tables: agent choices, /link codes, handoffs, who spoke where, memories,
identity links, approvals, cron jobs and usage records.

Import them from `app.db.models` (the one schema); this module is one part of it.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
)

from app.db.base import Id, UTCDateTime, metadata

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


# One row per model call (`app.usage`): what it cost, and whose it was — the session,
# sender, chat, channel, agent and model — for /usage, budgets, the admin API and the CLI.
usage_records = Table(
    "usage_records",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("day", String(10), nullable=False),  # YYYY-MM-DD (UTC); a month is a range of days
    Column("session_key", String(512), nullable=False),
    Column("identity", String(600), nullable=False),  # the sender, as memory owners are named
    Column("chat", String(600), nullable=False),  # channel:chat_id, escaped like keys
    Column("channel", String(64), nullable=False),
    Column("agent", String(100), nullable=False),
    Column("model", String(200), nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cached_tokens", BigInteger, nullable=False),
    # Speech to text: the seconds of audio transcribed (its rows have no tokens).
    Column("audio_seconds", Float, nullable=False, server_default="0"),
    Column("cost", Float, nullable=True),  # in `currency`; None when no price is known
    Column("currency", String(8), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Index("ix_usage_records_day", "day"),
    Index("ix_usage_records_identity_day", "identity", "day"),
    Index("ix_usage_records_chat_day", "chat", "day"),
    Index("ix_usage_records_agent_day", "agent", "day"),
)
