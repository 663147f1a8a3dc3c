"""The gatekeeping tables: who may talk to the bot, pairing requests, quota counters,
the admin lockout and the incidents the gateway detects itself.

Import them from `app.db.models` (the one schema); this module is one part of it.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from app.db.base import Id, UTCDateTime, metadata

# Wrong admin tokens per client address, shared by every replica: a fixed window opened
# by the first failure; `failures` counts within it (`app.web.admin_auth.AdminLockout`).
admin_auth_failures = Table(
    "admin_auth_failures",
    metadata,
    Column("client", String(64), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("window_start", Float, nullable=False),  # unix seconds
)


# Who may talk to the bot (`app.access`): senders and group chats allowed at runtime, on
# top of each channel's static `allowed_senders`/`allowed_chats`.
access_entries = Table(
    "access_entries",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("channel", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # sender | chat | admin
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


# Incidents the gateway detects itself (`app.alerts`): one row per incident name; the
# replica whose statement moves a row between open and resolved sends that notice, so
# every replica watches but each incident is announced once, and its recovery once.
alert_incidents = Table(
    "alert_incidents",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("state", String(16), nullable=False),  # open | resolved
    Column("detail", Text, nullable=True),
    Column("opened_at", UTCDateTime, nullable=False),
    Column("resolved_at", UTCDateTime, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
)
