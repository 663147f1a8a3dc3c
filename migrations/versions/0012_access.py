"""access_entries, access_pairings, access_counters: who may talk to the bot, and quotas

Revision ID: 0011_access
Revises: 0011_tracing
Create Date: 2026-12-04 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import Id, UTCDateTime

revision: str = "0011_access"
down_revision: str | None = "0011_tracing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "access_entries",
        sa.Column("id", Id, autoincrement=True),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(256), nullable=False),
        sa.Column("note", sa.String(200), nullable=True),
        sa.Column("added_by", sa.String(256), nullable=True),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_access_entries"),
        sa.UniqueConstraint("channel", "kind", "subject", name="uq_access_entries_channel_kind_subject"),
    )
    op.create_table(
        "access_pairings",
        sa.Column("id", Id, autoincrement=True),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("sender_id", sa.String(256), nullable=False),
        sa.Column("chat_id", sa.String(256), nullable=False),
        sa.Column("code", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("approved_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("approved_by", sa.String(256), nullable=True),
        sa.Column("text", sa.String(200), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_access_pairings"),
        sa.UniqueConstraint("code", name="uq_access_pairings_code"),
        sa.UniqueConstraint("channel", "sender_id", name="uq_access_pairings_channel_sender_id"),
    )
    op.create_index("ix_access_pairings_status_expires_at", "access_pairings", ["status", "expires_at"])
    op.create_table(
        "access_counters",
        sa.Column("metric", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(800), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("notified", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("metric", "subject", name="pk_access_counters"),
    )
    op.create_index("ix_access_counters_window_start", "access_counters", ["window_start"])


def downgrade() -> None:
    op.drop_table("access_counters")
    op.drop_index("ix_access_pairings_status_expires_at", table_name="access_pairings")
    op.drop_table("access_pairings")
    op.drop_table("access_entries")
