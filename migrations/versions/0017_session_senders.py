"""session_senders: which sender spoke in which conversation (for /sessions across chats)

Revision ID: 0017_session_senders
Revises: 0016_handoff_notices
Create Date: 2026-12-05 07:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import UTCDateTime

revision: str = "0017_session_senders"
down_revision: str | None = "0016_handoff_notices"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "session_senders",
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("identity", sa.String(600), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("chat_id", sa.String(512), nullable=False),
        sa.Column("first_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", "identity", name="pk_session_senders"),
    )
    op.create_index("ix_session_senders_identity", "session_senders", ["identity"])


def downgrade() -> None:
    op.drop_index("ix_session_senders_identity", table_name="session_senders")
    op.drop_table("session_senders")
