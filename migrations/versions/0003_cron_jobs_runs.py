"""cron jobs: one-shot run_at, run counting, last error, lookup by source session

Revision ID: 0003_cron
Revises: 0002_memory
Create Date: 2026-12-02 11:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.models

revision: str = "0003_cron"
down_revision: str | None = "0002_memory"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cron_jobs", schema=None) as batch_op:
        batch_op.alter_column("schedule", existing_type=sa.String(length=200), nullable=True)
        batch_op.add_column(sa.Column("run_at", app.db.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("max_runs", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("runs", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("last_error", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("updated_at", app.db.models.UTCDateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_cron_jobs_source_session_key", ["source_session_key"], unique=False)


def downgrade() -> None:
    op.execute("DELETE FROM cron_jobs WHERE schedule IS NULL")
    with op.batch_alter_table("cron_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_cron_jobs_source_session_key")
        batch_op.drop_column("updated_at")
        batch_op.drop_column("last_error")
        batch_op.drop_column("runs")
        batch_op.drop_column("max_runs")
        batch_op.drop_column("run_at")
        batch_op.alter_column("schedule", existing_type=sa.String(length=200), nullable=False)
