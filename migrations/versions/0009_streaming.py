"""stream_previews: a streamed reply's preview message, completed by the final answer

Revision ID: 0007_streaming
Revises: 0006_no_channel_ix
Create Date: 2026-12-04 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.models

revision: str = "0007_streaming"
down_revision: str | None = "0007_connections"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stream_previews",
        sa.Column("id", app.db.models.Id, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("chat_id", sa.String(256), nullable=False),
        sa.Column("platform_message_id", sa.String(256), nullable=False),
        sa.Column("final_message_id", sa.String(64), nullable=True),
        sa.Column("created_at", app.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", app.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_stream_previews"),
        sa.UniqueConstraint("event_id", name="uq_stream_previews_event_id"),
    )
    op.create_index("ix_stream_previews_created_at", "stream_previews", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_stream_previews_created_at", table_name="stream_previews")
    op.drop_table("stream_previews")
