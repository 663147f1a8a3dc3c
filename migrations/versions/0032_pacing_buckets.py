"""pacing_buckets: outbound token buckets per bot, chat and group, shared by replicas

Revision ID: 0032_pacing_buckets
Revises: 0031_outbox_claim_owner
Create Date: 2026-12-06 19:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0032_pacing_buckets"
down_revision: str | None = "0031_outbox_claim_owner"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pacing_buckets",
        sa.Column("name", sa.String(700), nullable=False),
        sa.Column("next_free", sa.Float(), nullable=False),
        sa.Column("paused_until", sa.Float(), nullable=False),
        sa.Column("finals_waiting_until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_pacing_buckets"),
    )


def downgrade() -> None:
    op.drop_table("pacing_buckets")
