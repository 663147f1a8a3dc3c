"""alert_incidents: incidents the gateway detected, announced once across replicas

Revision ID: 0024_alert_incidents
Revises: 0018_unfinished_indexes
Create Date: 2026-12-06 17:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.db.models import UTCDateTime

revision: str = "0024_alert_incidents"
down_revision: str | None = "0018_unfinished_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alert_incidents",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("opened_at", UTCDateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", UTCDateTime(timezone=True), nullable=True),
        sa.Column("updated_at", UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_alert_incidents"),
    )


def downgrade() -> None:
    op.drop_table("alert_incidents")
