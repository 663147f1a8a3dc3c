"""Finished inbox and outbox rows are deleted after a retention period; history never is.

The inbox keeps one row per accepted event and the outbox one per reply; without pruning
both grow with every message forever. Only finished rows go (inbox `done`/`discarded`/`canceled`,
outbox `sent`/`discarded`), oldest first, in bounded batches so a sweep never holds long
locks. A `failed` row is a dead letter nobody acted on yet: it is never deleted here,
only after an operator retried or discarded it (`app.dead_letters`). Conversation
history (`messages`), run traces and sessions are not touched.

The inbox row is also the dedup record of `(channel, external_id)`: a platform
redelivering an event older than the inbox retention would be accepted again. Platforms
redeliver within minutes to hours, so the default of 14 days is far outside that.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import autocommit
from app.db.models import CANCELED, inbox, outbox, utcnow

BATCH = 5000
MAX_BATCHES = 20  # per table and sweep: a large backlog is worked off over several sweeps


def _prune_statement(table: Any, statuses: tuple[str, ...], age_column: Any) -> Any:
    # No ORDER BY: any batch of expired rows will do, and the age column is indexed, so a
    # sweep with nothing to delete reads a few index entries instead of every finished row.
    expired = (
        select(table.c.id)
        .where(age_column < bindparam("cutoff"), table.c.status.in_(statuses))
        .limit(bindparam("batch"))
    )
    return delete(table).where(table.c.id.in_(expired.scalar_subquery()))


# Ages: an event counts from its acceptance (the dedup window starts there; indexed by
# ix_inbox_created_at); a reply from its last scheduled attempt (ix_outbox_status_next).
_PRUNE_INBOX = _prune_statement(inbox, ("done", "discarded", CANCELED), inbox.c.created_at)
_PRUNE_OUTBOX = _prune_statement(outbox, ("sent", "discarded"), outbox.c.next_attempt_at)


async def prune(
    engine: AsyncEngine,
    *,
    inbox_days: float,
    outbox_days: float,
    now: datetime | None = None,
    batch: int = BATCH,
) -> dict[str, int]:
    """Delete finished rows older than their retention (0 days: keep); returns the counts."""
    now = now or utcnow()
    counts = {"inbox": 0, "outbox": 0}
    single = autocommit(engine)  # each batch is one statement and commits on its own
    tables = (("inbox", _PRUNE_INBOX, inbox_days), ("outbox", _PRUNE_OUTBOX, outbox_days))
    for name, statement, days in tables:
        if days <= 0:
            continue
        params = {"cutoff": now - timedelta(days=days), "batch": batch}
        for _ in range(MAX_BATCHES):
            async with single.connect() as conn:
                deleted = (await conn.execute(statement, params)).rowcount
            counts[name] += deleted
            if deleted < batch:
                break
    return counts
