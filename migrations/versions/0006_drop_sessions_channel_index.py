"""Drop ix_sessions_channel: the turn's session update must find its row by primary key

A prepared statement's generic plan, made while the tables are small, costed the
channel index the same as the primary key for `id = (current session) AND channel = ...`
and scanned every session of the channel on every turn. Nothing needs the index: the
admin list filters by channel but orders by activity, and few channels match most rows.

Revision ID: 0006_no_channel_ix
Revises: 0005_watched
Create Date: 2026-12-03 17:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006_no_channel_ix"
down_revision: str | None = "0005_watched"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_index("ix_sessions_channel")


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.create_index("ix_sessions_channel", ["channel"], unique=False)
