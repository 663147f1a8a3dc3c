"""memory: identity links, one memory per (scope, owner, key)

Revision ID: 0002_memory
Revises: 0001
Create Date: 2026-12-02 11:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import app.db.models

revision: str = "0002_memory"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "identity_links",
        sa.Column("identity", sa.String(length=600), nullable=False),
        sa.Column("person_id", sa.String(length=200), nullable=False),
        sa.Column("created_at", app.db.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=256), nullable=True),
        sa.PrimaryKeyConstraint("identity", name=op.f("pk_identity_links")),
    )
    with op.batch_alter_table("identity_links", schema=None) as batch_op:
        batch_op.create_index("ix_identity_links_person_id", ["person_id"], unique=False)
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.create_index("uq_memories_scope_owner_key", ["scope", "owner", "key"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("memories", schema=None) as batch_op:
        batch_op.drop_index("uq_memories_scope_owner_key")
    with op.batch_alter_table("identity_links", schema=None) as batch_op:
        batch_op.drop_index("ix_identity_links_person_id")
    op.drop_table("identity_links")
