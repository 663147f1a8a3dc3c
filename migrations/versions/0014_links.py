"""link_codes: the one-time codes of /link; handoffs: /handoff's redirects

Revision ID: 0011_links
Revises: 0011_push_conn_state
Create Date: 2026-12-04 16:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import UTCDateTime

revision: str = "0011_links"
down_revision: str | None = "0011_push_conn_state"
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
    op.create_table(
        "handoffs",
        sa.Column("from_key", sa.String(512), nullable=False),
        sa.Column("to_key", sa.String(512), nullable=False),
        sa.Column("identity", sa.String(600), nullable=False),
        sa.Column("created_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("from_key", name="pk_handoffs"),
    )
    op.create_index("ix_handoffs_to_key", "handoffs", ["to_key"])


def downgrade() -> None:
    op.drop_index("ix_handoffs_to_key", table_name="handoffs")
    op.drop_table("handoffs")
    op.drop_table("link_codes")
