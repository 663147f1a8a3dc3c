"""indexes for lookups that scanned: outbox by event, per-minute dashboard counts

Revision ID: 0004_indexes
Revises: 0003_cron
Create Date: 2026-12-02 21:40:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004_indexes"
down_revision: str | None = "0003_cron"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = [
    ("ix_inbox_created_at", "inbox", ["created_at"]),
    ("ix_outbox_event_id", "outbox", ["event_id"]),
    ("ix_outbox_sent_at", "outbox", ["sent_at"]),
    ("ix_runs_started_at", "runs", ["started_at"]),
]


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns, unique=False)


def downgrade() -> None:
    for name, table, _columns in reversed(INDEXES):
        op.drop_index(name, table_name=table)
