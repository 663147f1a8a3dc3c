"""The sender's claim of due outbox rows, in one statement (`PipelineStore.claim_outbox`)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, update
from sqlalchemy.orm import aliased

from app.db.direct import Direct
from app.db.models import OUTBOX_UNDELIVERED, one_of, outbox


@functools.cache
def claim_statement(skip_locked: bool, channels: tuple[str, ...]) -> Direct:
    """Claim the due rows that are the oldest undelivered one of their key, in one statement.

    Built once per sender (its channels are fixed; `one_of`): it runs after every reply,
    on asyncpg directly (`app.db.direct`).
    """
    earlier = aliased(outbox)
    now: Any = bindparam("now")
    # A claim is free once its deadline passed, and at once to the sender that holds it:
    # that sender is not delivering it (it claims only between batches), so the claim is
    # one whose commit reached the database while its answer was lost on the way back.
    due = or_(
        and_(outbox.c.status == "pending", outbox.c.next_attempt_at <= now),
        and_(
            outbox.c.status == "sending",
            or_(outbox.c.claimed_until < now, outbox.c.claimed_by == bindparam("owner")),
        ),
    )
    # The oldest undelivered row of its key: one probe of the partial index of undelivered
    # rows (`ix_outbox_undelivered`) per candidate. As `NOT EXISTS (an earlier one)` the
    # planner made it an anti-join, and with statistics from when the table was small it
    # walked that whole index for every candidate (seconds with tens of thousands of dead
    # row versions, `bench/bench_unfinished_queries.py`).
    oldest = (
        select(func.min(earlier.c.id))
        .where(earlier.c.session_key == outbox.c.session_key, one_of(earlier.c.status, OUTBOX_UNDELIVERED))
        .scalar_subquery()
    )
    # `status IN undelivered` is implied by `due`, and said: the candidates come from the
    # same partial index, whatever the table's history.
    candidates = (
        select(outbox.c.id)
        .where(
            one_of(outbox.c.status, OUTBOX_UNDELIVERED),
            due,
            outbox.c.id == oldest,
            one_of(outbox.c.channel, channels),
        )
        .order_by(outbox.c.id)
        .limit(bindparam("limit"))
    )
    if skip_locked:  # PostgreSQL: replicas claiming at once pass over each other's rows
        candidates = candidates.with_for_update(skip_locked=True)
    return Direct(
        update(outbox)
        .where(outbox.c.id.in_(candidates.scalar_subquery()))
        .values(
            status="sending",
            claimed_until=bindparam("until"),
            claimed_by=bindparam("owner"),
            attempts=outbox.c.attempts + 1,
        )
        .returning(outbox)
    )
