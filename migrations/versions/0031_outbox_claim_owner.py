"""outbox.claimed_by: which sender holds a row's claim

A sender whose claim committed but whose answer was lost (a connection dropped after the
commit) recognises the claim as its own and resumes at once; other replicas still wait
for `claimed_until`. Expand only: the previous release neither reads nor writes it.

Revision ID: 0031_outbox_claim_owner
Revises: 0030_usage_audio_seconds
Create Date: 2026-12-06 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0031_outbox_claim_owner"
down_revision: str | None = "0030_usage_audio_seconds"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch_op:
        batch_op.add_column(sa.Column("claimed_by", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch_op:
        batch_op.drop_column("claimed_by")
