"""admin_auth_failures: the admin lockout's count, shared by every replica

Revision ID: 0007_hardening
Revises: 0006_no_channel_ix
Create Date: 2026-12-04 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_hardening"
down_revision: str | None = "0006_no_channel_ix"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admin_auth_failures",
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("window_start", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("client", name="pk_admin_auth_failures"),
    )


def downgrade() -> None:
    op.drop_table("admin_auth_failures")
