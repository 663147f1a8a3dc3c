"""pacing_buckets.sending_until: one final answer in flight per chat, across replicas

Revision ID: 0033_pacing_sending_until
Revises: 0032_pacing_buckets
Create Date: 2026-12-06 23:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0033_pacing_sending_until"
down_revision: str | None = "0032_pacing_buckets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pacing_buckets") as batch:
        batch.add_column(sa.Column("sending_until", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("pacing_buckets") as batch:
        batch.drop_column("sending_until")
