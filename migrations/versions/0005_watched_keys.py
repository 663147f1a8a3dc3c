"""session_keys.watched_until: which keys a browser watches on some replica

Revision ID: 0005_watched
Revises: 0004_indexes
Create Date: 2026-12-03 11:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.models

revision: str = "0005_watched"
down_revision: str | None = "0004_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("session_keys") as batch:
        batch.add_column(sa.Column("watched_until", app.db.models.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("session_keys") as batch:
        batch.drop_column("watched_until")
