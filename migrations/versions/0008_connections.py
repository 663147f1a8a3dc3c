"""connection_leases: one holder per long-lived platform connection across replicas

Revision ID: 0007_connections
Revises: 0006_no_channel_ix
Create Date: 2026-12-04 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.models

revision: str = "0007_connections"
down_revision: str | None = "0007_hardening"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "connection_leases",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("expires_at", app.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("acquired_at", app.db.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("takeovers", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("connection_leases")
