"""link_codes: the one-time codes of /link

Revision ID: 0011_links
Revises: 0007_agents
Create Date: 2026-12-04 16:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import UTCDateTime

revision: str = "0011_links"
down_revision: str | None = "0007_agents"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "link_codes",
        sa.Column("code_hash", sa.String(64), nullable=False),
        sa.Column("identity", sa.String(600), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("expires_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("code_hash", name="pk_link_codes"),
    )


def downgrade() -> None:
    op.drop_table("link_codes")
