"""usage_records: one row per model call, for usage, cost and budgets

Revision ID: 0025_usage_records
Revises: 0024_alert_incidents
Create Date: 2026-12-06 17:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import Id, UTCDateTime

revision: str = "0025_usage_records"
down_revision: str | None = "0024_alert_incidents"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("session_key", sa.String(512), nullable=False),
        sa.Column("identity", sa.String(600), nullable=False),
        sa.Column("chat", sa.String(600), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(100), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=True),
        sa.Column("currency", sa.String(8), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage_records"),
    )
    for name, columns in (
        ("ix_usage_records_day", ["day"]),
        ("ix_usage_records_identity_day", ["identity", "day"]),
        ("ix_usage_records_chat_day", ["chat", "day"]),
        ("ix_usage_records_agent_day", ["agent", "day"]),
    ):
        op.create_index(name, "usage_records", columns)


def downgrade() -> None:
    op.drop_table("usage_records")
