"""Partial indexes on the unfinished inbox and outbox rows

The queries that look for work (a key's next inbox rows, the keys waiting for a worker,
the outbox's due replies and the earlier undelivered reply of their key) now find it in
indexes that hold only unfinished rows: their cost follows the number of unfinished rows,
not the table's history, its dead row versions (a 35-minute soak with autovacuum off
walked tens of thousands of them per outbox claim) or the planner's statistics.

Expand/contract: this release adds the two partial indexes and drops two indexes
whose every query the partial ones serve (`ix_inbox_status_id`: the claimable keys and the
unfinished count; `ix_outbox_key_id`: the earlier undelivered reply of a key and a
session's undelivered count). Dropping an index changes no result, so the previous
release's code runs unchanged against this schema (its statements bind the statuses as
parameters; PostgreSQL's custom plans still use the partial indexes). The other status
indexes stay: `ix_inbox_key_status_id` serves a key's inbox rows of every status (A2A
task counts), `ix_outbox_status_next` the retention sweep.

No fillfactor: the updates that could be HOT (`session_keys`, `runs`) already were
(100 % and 98 % in `bench/ab_webhook.py --sizes`); inbox, outbox and sessions updates
change indexed columns (a partial index's predicate counts as one), so room on the page
would not make them HOT.

Revision ID: 0018_unfinished_indexes
Revises: 0017_session_senders
Create Date: 2026-12-06 17:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_unfinished_indexes"
down_revision: str | None = "0017_session_senders"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INBOX_UNFINISHED = sa.text("status IN ('pending', 'processing')")
_OUTBOX_UNDELIVERED = sa.text("status IN ('pending', 'sending')")


def upgrade() -> None:
    op.create_index(
        "ix_inbox_unfinished",
        "inbox",
        ["session_key", "id"],
        postgresql_where=_INBOX_UNFINISHED,
        sqlite_where=_INBOX_UNFINISHED,
    )
    op.create_index(
        "ix_outbox_undelivered",
        "outbox",
        ["session_key", "id"],
        postgresql_where=_OUTBOX_UNDELIVERED,
        sqlite_where=_OUTBOX_UNDELIVERED,
    )
    op.drop_index("ix_inbox_status_id", table_name="inbox")
    op.drop_index("ix_outbox_key_id", table_name="outbox")


def downgrade() -> None:
    op.create_index("ix_outbox_key_id", "outbox", ["session_key", "id"])
    op.create_index("ix_inbox_status_id", "inbox", ["status", "id"])
    op.drop_index("ix_outbox_undelivered", table_name="outbox")
    op.drop_index("ix_inbox_unfinished", table_name="inbox")
