"""memories.namespace: an agent's memory_namespace separates its user and session memory

Existing rows get the default namespace "" (today's behaviour: one shared namespace),
so nothing is migrated. The unique index gains the namespace, so two agents can keep an
entry with the same key for the same person.

Revision ID: 0015_memory_namespace
Revises: 0011_links
Create Date: 2026-12-05 07:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_memory_namespace"
down_revision: str | None = "0011_links"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memories", sa.Column("namespace", sa.String(100), nullable=False, server_default=""))
    op.drop_index("uq_memories_scope_owner_key", table_name="memories")
    op.create_index(
        "uq_memories_scope_owner_ns_key", "memories", ["scope", "owner", "namespace", "key"], unique=True
    )


def downgrade() -> None:
    # Entries of other namespaces would collide with the default one's: keep the default's.
    op.execute("DELETE FROM memories WHERE namespace <> ''")
    op.drop_index("uq_memories_scope_owner_ns_key", table_name="memories")
    op.create_index("uq_memories_scope_owner_key", "memories", ["scope", "owner", "key"], unique=True)
    with op.batch_alter_table("memories") as batch:
        batch.drop_column("namespace")
