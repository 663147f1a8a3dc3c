"""handoffs.origin / handoffs.target: the two chats of a /handoff, for its notices

`origin` is the chat /handoff was sent from (channel, chat_id, thread_id, identity),
`target` the direct chat it was handed to (channel, chat_id). Rows made before have
neither: they still redirect, without notices.

Revision ID: 0016_handoff_notices
Revises: 0015_memory_namespace
Create Date: 2026-12-05 07:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_handoff_notices"
down_revision: str | None = "0015_memory_namespace"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("handoffs") as batch:
        batch.add_column(sa.Column("origin", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("target", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("handoffs") as batch:
        batch.drop_column("target")
        batch.drop_column("origin")
