"""usage_records.audio_seconds: speech-to-text seconds as usage

Revision ID: 0030_usage_audio_seconds
Revises: 0025_usage_records
Create Date: 2026-12-06 19:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030_usage_audio_seconds"
down_revision: str | None = "0025_usage_records"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Expand only: a new column with a default, so a replica still on the old code keeps
    # inserting rows (without the column) while another already writes it.
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("audio_seconds", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("audio_seconds")
