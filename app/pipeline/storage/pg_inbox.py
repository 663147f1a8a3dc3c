"""PostgreSQL statements of ingest and leases (the catalogue `PostgresStore` runs).

A key's next inbox rows come with the statement that takes its lease: the worker knows
its next turn without a read of its own. Taking a lease reads the rows as they were when
the statement began, and its upsert may have waited for another worker's release, which
committed after that: rows that worker finished would then look unfinished. So the rows
count only when the statement's own snapshot shows the lease free (or ours, or the key
new) at the fence just below the one it took: nobody held the lease in between
(`nobody_between`). Otherwise they are left out (NULL) and read separately.

An event's own acceptance can take the lease too (`ACCEPT_TAKING`): when the key's lease
is free and the accepting replica has a run slot for it, the statement that stores the
event takes the lease and reads the key's rows. The same rule decides whether the rows
count; the event just stored is not among them (the statement cannot see its own insert)
and is added by the caller.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Integer,
    and_,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import DateTime, String, Text

from app.db.direct import Direct, rows_as_json
from app.db.engine import lax_commit
from app.db.models import inbox, session_keys
from app.db.upsert import insert_for, insert_ignore_for
from app.pipeline.storage.inbox_queries import (
    INSERT_VALUES,
    NEXT_ROWS,
    ORIGINAL,
    UPCOMING_LIMIT,
    unfinished_rows,
)
from app.pipeline.storage.port import InboxRow
from app.sessions import lease as leases

_K = session_keys.c
# Whether some replica's session bus watches the key (`app.pg_bus`), as a statement
# that updates or locks the key's row sees it: a watcher marking it is ordered with it.
WATCHED = func.coalesce(_K.watched_until > func.now(), False).label("watched")

LIMIT = UPCOMING_LIMIT


def upcoming(limit: int, *, exclude: Any = None, key: Any = None) -> Any:
    """The `key` key's next rows (default key: `k`; but `exclude`d ids) as JSON, for `rows_from`."""
    rows = unfinished_rows(key)
    if exclude is not None:
        rows = rows.where(inbox.c.id != func.all(exclude))
    subquery = rows.limit(limit).subquery("upcoming")
    return rows_as_json(subquery, "upcoming", subquery.c.id)


def rows_from(objects: list[dict[str, Any]] | None) -> list[InboxRow] | None:
    return None if objects is None else [InboxRow.of(o) for o in objects]


# --- ingest -----------------------------------------------------------------------------

INSERT = Direct(inbox.insert().values(INSERT_VALUES))
INSERT_NEW = Direct(
    insert_ignore_for("postgresql", inbox, ["channel", "external_id"])
    .values(INSERT_VALUES)
    .returning(inbox.c.id)
)
FIND_ORIGINAL = Direct(ORIGINAL)

# Events arriving together, in one statement (`pg_group_insert`): `unnest` of arrays, so
# one prepared statement for any number of rows, in arrival order.
INSERT_MANY = Direct(
    text(
        "INSERT INTO inbox"
        " (event_id, channel, external_id, session_key, payload, status, attempts, created_at, updated_at,"
        " trace_context)"
        " SELECT e, c, x, k, p::json, 'pending', 0, t, t, j::json"
        " FROM unnest(:e, :c, :x, :k, :p, :t, :j) WITH ORDINALITY AS given(e, c, x, k, p, t, j, n)"
        " ORDER BY n"
        " ON CONFLICT (channel, external_id) DO NOTHING"
        " RETURNING event_id"
    ).bindparams(
        *(bindparam(name, type_=ARRAY(String)) for name in ("e", "c", "x", "k")),
        bindparam("p", type_=ARRAY(Text)),
        bindparam("j", type_=ARRAY(Text)),
        bindparam("t", type_=ARRAY(DateTime(timezone=True))),
    )
)


def take_if_free(key: Any, *, when: Any) -> Any:
    """A CTE taking `key`'s lease for `o` until `exp` if it is free (or the key new) and `when`.

    Returns the fence taken (no row when the lease was held). A lease that is ours already
    is not taken: some worker of this replica holds it, and bumping its fence would fence
    it out.
    """
    owner: Any = bindparam("o")
    expires: Any = bindparam("exp", type_=_K.lease_expires_at.type)
    take = insert_for("postgresql", session_keys).from_select(
        ["key", "lease_owner", "lease_fence", "lease_expires_at"],
        select(key, owner, literal(1), expires).where(when),
    )
    return (
        take.on_conflict_do_update(
            index_elements=["key"],
            set_={"lease_owner": owner, "lease_fence": _K.lease_fence + 1, "lease_expires_at": expires},
            where=_K.lease_owner.is_(None),
        )
        .returning(_K.lease_fence, WATCHED)
        .cte("taken")
    )


def take_if_free_and_unlocked(key: Any, *, when: Any) -> Any:
    """`take_if_free`, but never waiting for the key's row: a row another transaction has
    locked is left alone (no row; the key then takes its lease with a statement of its own).

    For a turn's end, which holds its own key's row lock while it takes the next key's
    lease: two replicas, each handing its run slot on to a key the other is finishing,
    would otherwise wait for each other until PostgreSQL broke the deadlock. An existing
    row is taken through `FOR UPDATE SKIP LOCKED`; a new key's row is only inserted when
    the statement's snapshot has none.
    """
    owner: Any = bindparam("o")
    expires: Any = bindparam("exp", type_=_K.lease_expires_at.type)
    free = (
        select(_K.key)
        .where(_K.key == key, _K.lease_owner.is_(None), when)
        .with_for_update(skip_locked=True)
        .cte("free")
    )
    existing = (
        update(session_keys)
        .where(_K.key.in_(select(free.c.key)))
        .values(lease_owner=owner, lease_fence=_K.lease_fence + 1, lease_expires_at=expires)
        .returning(_K.lease_fence)
        .cte("existing")
    )
    new = (
        insert_for("postgresql", session_keys)
        .from_select(
            ["key", "lease_owner", "lease_fence", "lease_expires_at"],
            select(key, owner, literal(1), expires).where(
                when, ~select(_K.key).where(_K.key == key).exists()
            ),
        )
        .on_conflict_do_nothing(index_elements=["key"])
        .returning(_K.lease_fence)
        .cte("new")
    )
    return union_all(select(existing.c.lease_fence), select(new.c.lease_fence)).cte("taken")


def nobody_between(taken: Any, key: Any, *, ours_counts: bool = False) -> Any:
    """Whether the statement's snapshot shows `key`'s lease free (or the key new; with
    `ours_counts` also ours) at the fence just below the one `taken` took (see the module)."""
    prior = select(_K.lease_owner, _K.lease_fence).where(_K.key == key).subquery("prior")
    free: Any = prior.c.lease_owner.is_(None)
    if ours_counts:
        free = or_(free, prior.c.lease_owner == bindparam("o"))
    before = select(prior.c.lease_fence).where(free)
    return or_(
        and_(~select(prior.c.lease_fence).exists(), taken.c.lease_fence == 1),
        taken.c.lease_fence == before.scalar_subquery() + literal_column("1", Integer),
    )


def rows_if_nobody_between(taken: Any, key: Any) -> Any:
    """`key`'s next rows as JSON when they count for the lease `taken` took, else NULL."""
    rows = select(case((nobody_between(taken, key), upcoming(LIMIT, key=key)), else_=None)).select_from(taken)
    return rows.scalar_subquery()


def _accept_taking(dedup: bool) -> Any:
    """Insert the event (skipping a duplicate when `dedup`) and take the key's free lease.

    Returns the new row's `id` (None for a duplicate), the `fence` taken (None when the
    lease was held, or the event a duplicate) and `upcoming`, the key's other unfinished
    rows when they count. Commits like any ingest: durably, not with `lax_commit`.
    """
    store = insert_ignore_for("postgresql", inbox, ["channel", "external_id"]) if dedup else inbox.insert()
    stored = store.values(INSERT_VALUES).returning(inbox.c.id).cte("stored")
    key = bindparam("k", type_=_K.key.type)
    taken = take_if_free(key, when=select(stored.c.id).exists())
    return select(
        select(stored.c.id).scalar_subquery().label("id"),
        select(taken.c.lease_fence).scalar_subquery().label("fence"),
        rows_if_nobody_between(taken, key).label("upcoming"),
    )


# By whether the event has an external id to deduplicate on.
ACCEPT_TAKING = {dedup: Direct(_accept_taking(dedup)) for dedup in (True, False)}


def _take_statement() -> Any:
    """`leases.take_free_or_new`, reading the key's next rows when they count."""
    taken = leases.take_free_or_new("postgresql").returning(_K.lease_fence).cte("taken")
    counted = nobody_between(taken, bindparam("k"), ours_counts=True)
    return select(
        taken.c.lease_fence,
        case((counted, upcoming(LIMIT)), else_=None).label("upcoming"),
        lax_commit(),
    ).select_from(taken)


TAKE = Direct(_take_statement())
NEXT = Direct(NEXT_ROWS)
