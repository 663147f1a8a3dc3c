"""PostgreSQL: a key's next inbox rows come with the statement that takes its lease or ends a turn.

The dispatcher reads a key's next unfinished rows (`Inbox.next_rows`) before every turn:
a round trip of its own, one per event, after the lease take or the previous turn's end.
Here both statements read them too, so the worker knows its next turn without asking.

The end of a turn holds the lease while it reads, so what it reads is what the next read
would return, but for events accepted after the statement began, which come as before (in
`Dispatcher._again`, or from the release's check).

Taking the lease is another matter: the statement reads the rows as they were when it
began, and its upsert may have waited for another worker's release, which committed
after that. Rows that worker finished would then look unfinished. So the rows count only
when the statement's own snapshot shows the lease free (or ours, or the key new) at the
fence just below the one it took: nobody held the lease in between. Otherwise they are
left out (`None`) and read separately. `tests/pipeline/test_prefetch.py` makes that
interleaving happen.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, and_, bindparam, case, func, literal_column, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.direct import Direct, rows_as_json
from app.db.engine import lax_commit
from app.db.models import INBOX_UNFINISHED, inbox, one_of, session_keys
from app.events import InboundEvent
from app.pipeline.inbox import InboxRow
from app.sessions import lease as leases

_K = session_keys.c
_COLUMNS = ("id", "event_id", "channel", "session_key", "attempts", "payload")


def upcoming(limit: int, *, exclude: Any = None) -> Any:
    """The `k` key's first `limit` unfinished rows in inbox order (but `exclude`d ids), as JSON."""
    conditions = [inbox.c.session_key == bindparam("k"), one_of(inbox.c.status, INBOX_UNFINISHED)]
    if exclude is not None:
        conditions.append(inbox.c.id != func.all(exclude))
    rows = (
        select(*(inbox.c[name] for name in _COLUMNS))
        .where(*conditions)
        .order_by(inbox.c.id)
        .limit(limit)
        .subquery("upcoming")
    )
    return rows_as_json(rows, "upcoming", rows.c.id)


def rows_from(objects: Sequence[dict[str, Any]]) -> list[InboxRow]:
    return [
        InboxRow(
            id=o["id"],
            event_id=o["event_id"],
            channel=o["channel"],
            session_key=o["session_key"],
            attempts=o["attempts"],
            event=InboundEvent.model_validate(o["payload"]),
        )
        for o in objects
    ]


# What a turn needs to know of the rows after it: the next one, and whether one more waits.
LIMIT = 2


def _take_statement() -> Any:
    taken = leases.take_free_or_new("postgresql").returning(_K.lease_fence).cte("taken")
    prior = select(_K.lease_owner, _K.lease_fence).where(_K.key == bindparam("k")).subquery("prior")
    before = select(prior.c.lease_fence).where(
        or_(prior.c.lease_owner.is_(None), prior.c.lease_owner == bindparam("o"))
    )
    nobody_between = or_(
        and_(~select(prior.c.lease_fence).exists(), taken.c.lease_fence == 1),
        taken.c.lease_fence == before.scalar_subquery() + literal_column("1", Integer),
    )
    return select(
        taken.c.lease_fence,
        case((nobody_between, upcoming(LIMIT)), else_=None).label("upcoming"),
        lax_commit(),
    ).select_from(taken)


TAKE = Direct(_take_statement())


async def take(
    conn: AsyncConnection, key: str, owner: str, expires: datetime
) -> tuple[int, list[InboxRow] | None] | None:
    """Take the key's free lease (or create the key holding it), reading its next rows.

    Returns the new fence and the rows (None: read them separately, see the module), or
    None when the lease is held by another owner (or expired: `leases.acquire` decides).
    """
    row = await TAKE.first(conn, {"k": key, "o": owner, "exp": expires})
    if row is None:
        return None
    objects = row["upcoming"]
    return row["lease_fence"], None if objects is None else rows_from(objects)
