"""channel_records (A2A push configs) and connection_leases.state (a Discord session to resume)

Revision ID: 0011_push_conn_state
Revises: 0007_agents
Create Date: 2026-12-04 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import UTCDateTime

revision: str = "0011_push_conn_state"
down_revision: str | None = "0011_access"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("connection_leases") as batch:
        batch.add_column(sa.Column("state", sa.JSON(), nullable=True))
    op.create_table(
        "channel_records",
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("key", sa.String(400), nullable=False),
        sa.Column("owner", sa.String(200), nullable=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("open", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("channel", "kind", "key", name="pk_channel_records"),
    )
    op.create_index("ix_channel_records_open", "channel_records", ["channel", "kind", "open"])


def downgrade() -> None:
    op.drop_index("ix_channel_records_open", table_name="channel_records")
    op.drop_table("channel_records")
    with op.batch_alter_table("connection_leases") as batch:
        batch.drop_column("state")
