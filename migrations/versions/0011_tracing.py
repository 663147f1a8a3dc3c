"""tracing: the W3C trace context stored with inbox and outbox rows

A replica that takes an event (or delivers a reply) continues the trace of the replica
that accepted it (or ran its turn): see app/tracing.py. Nullable: rows of untraced
processes, and all rows from before, have none.

Revision ID: 0011_tracing
Revises: 0007_agents
Create Date: 2026-12-04 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_tracing"
down_revision: str | None = "0007_agents"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("inbox", "outbox"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("trace_context", sa.JSON(), nullable=True))


def downgrade() -> None:
    for table in ("inbox", "outbox"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("trace_context")
