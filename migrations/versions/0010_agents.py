"""agent_choices: the agent a conversation switched to with /agent

Revision ID: 0007_agents
Revises: 0006_no_channel_ix
Create Date: 2026-12-04 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import UTCDateTime

revision: str = "0007_agents"
down_revision: str | None = "0007_streaming"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_choices",
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("agent", sa.String(100), nullable=False),
        sa.Column("chosen_by", sa.String(256), nullable=False),
        sa.Column("updated_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_agent_choices"),
    )


def downgrade() -> None:
    op.drop_table("agent_choices")
