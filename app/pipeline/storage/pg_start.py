"""PostgreSQL: a turn's start as one statement (the catalogue `PostgresStore` runs).

Continue the key's current session, or open a new generation; append the user message;
insert the run row; and read what the run needs first (its history window and memory
recall), all under a locking read of the lease's fence (see `pg_turn`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    and_,
    bindparam,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from app.db.direct import Direct, rows_as_json
from app.db.engine import lax_commit
from app.db.models import inbox, messages, runs, session_keys, sessions
from app.memory.recall import recall_query
from app.pipeline.storage.inbox_queries import NOT_CANCELED
from app.pipeline.storage.pg_inbox import WATCHED
from app.pipeline.storage.pg_turn import RUN_FIELDS, count, insert_message, typed_params, watched
from app.sessions.store import TAIL_OPEN

_K = session_keys.c
# The turn's one row, by a scalar id: for `id = ANY($ids)` a prepared statement's generic
# plan (PostgreSQL's after five runs, kept for the connection's life) expects ten rows and
# scanned the whole inbox when it was planned while the table was small.
_INBOX_ID = bindparam("inbox_id", type_=BigInteger)


# An open session: one a turn may continue (`start_statement`).
OPEN = or_(sessions.c.status == "active", sessions.c.status == "suspended")


def continuable(current: Any) -> list[ColumnElement[bool]]:
    """The `sessions` row a turn continues: the `current` session, open, of the event's
    channel (`chan`), active since `cutoff`, its newest message leaving no tool-call group open."""
    return [
        sessions.c.id == current,
        OPEN,
        sessions.c.channel == bindparam("chan"),
        sessions.c.last_active_at >= bindparam("cutoff"),
        ~TAIL_OPEN,
    ]


def continue_session(current: Any, *conditions: Any) -> Any:
    """A CTE marking the `current` session active and taking a seq for the user message,
    if it is `continuable` and `conditions` hold. Returns its row."""
    now: Any = bindparam("now", type_=sessions.c.created_at.type)
    return (
        update(sessions)
        .where(*continuable(current), *conditions)
        .values(next_seq=sessions.c.next_seq + 1, status="active", last_active_at=now, updated_at=now)
        .returning(*sessions.c)
        .cte("bump")
    )


def first_reads(opened: Any, recall: bool | None) -> list[Any]:
    """What the run needs first, read for the session the `opened` CTE returns (see
    `start_statement`): `window` and, unless `recall` is None, `recalled`. They join
    `opened` themselves (no correlation): no rows when nothing opened."""
    window = (
        select(messages)
        .select_from(opened.join(messages, messages.c.session_id == opened.c.id))
        .where(messages.c.seq > opened.c.last_consolidated)
        .order_by(messages.c.seq.desc())
        .limit(bindparam("wlimit", type_=Integer))
        .subquery("win")
    )
    reads = [rows_as_json(window, "win", window.c.seq).label("window")]
    if recall is not None:
        recalled = recall_query(recall, session_id=opened.c.id).subquery("recalled")
        newest = (recalled.c.updated_at.desc(), recalled.c.id.desc())
        reads.append(rows_as_json(recalled, "recalled", *newest).label("recalled"))
    return reads


def start_statement(recall: bool | None, *, one: str = "one") -> Any:
    """The start of a turn in the common cases; writes nothing when neither applies.

    Continue: the key's current session is open, of the event's channel, active since
    `cutoff`, and its newest message leaves no tool-call group open. It is marked active.
    Open: the key has no open session active since `cutoff` (none yet, closed by /new, or
    of this channel and idle too long: then it is expired here). A new generation is created and made current.
    Either way the user message and the run row are written.
    Otherwise (`held` but no session: another channel's session, an open tool-call group)
    the caller takes the general path.

    The fence is a locking read here, not an update: the key's row is updated once, to
    point at a new generation (one statement may not update a row twice).

    It also reads what the run needs first, as it was before the statement (without the
    new user message): the session's newest `wlimit` messages after `last_consolidated`
    (`window`, the history window's rows, oldest first) and, unless `recall` is None, the
    memory recall (`recalled`, `app.memory.recall.recall_query` with the user scope when
    `recall` is true) of the opened session.
    """
    fence = (
        select(_K.key, WATCHED)
        .where(_K.key == bindparam("k"), _K.lease_owner == bindparam("o"), _K.lease_fence == bindparam("f"))
        .with_for_update()
        .cte("fence")
        .prefix_with("MATERIALIZED")
    )
    now: Any = bindparam("now", type_=sessions.c.created_at.type)
    # With `tally` (`TurnPlan.count_attempt`) the attempt is counted in this commit. The
    # row is locked first: a cancel (of a pending row) then waits for this commit, or came
    # first and the row is left out; a canceled row writes nothing.
    tally = bindparam("tally", type_=Boolean)
    countable = (
        select(inbox.c.id)
        .where(inbox.c.id == _INBOX_ID, NOT_CANCELED, tally)
        .with_for_update()
        .cte("countable")
        .prefix_with("MATERIALIZED")
    )
    held = and_(select(fence.c.key).exists(), or_(~tally, select(countable.c.id).exists()))
    current = select(_K.current_session_id).where(_K.key == bindparam("k")).scalar_subquery()
    bump = continue_session(current, held)
    # An open current session counts as live unless it is of this channel and idle since
    # before `cutoff` (the cutoff is this channel's lifecycle; another channel's session
    # is left to the general path).
    live = select(sessions.c.id).where(
        sessions.c.id == current,
        OPEN,
        or_(sessions.c.channel != bindparam("chan"), sessions.c.last_active_at >= bindparam("cutoff")),
    )
    due = and_(held, ~live.exists())  # a new generation
    expire = (
        update(sessions)
        .where(sessions.c.id == current, OPEN, due)
        .values(status="expired", closed_at=now, updated_at=now)
        .returning(sessions.c.id)
        .cte("expire")
    )
    generation = select(func.coalesce(func.max(sessions.c.generation), 0) + 1).where(
        sessions.c.key == bindparam("k")
    )
    created = (
        insert(sessions)
        .from_select(
            list(_NEW_SESSION),
            select(
                bindparam("k", type_=sessions.c.key.type),
                generation.scalar_subquery(),
                bindparam("chan", type_=sessions.c.channel.type),
                literal("active"),
                literal(0),
                literal(2),  # the user message is seq 1
                now,
                now,
                now,
                bindparam("meta", type_=sessions.c.metadata.type),
            ).where(due),
        )
        .returning(*sessions.c)
        .cte("created")
    )
    point = (
        update(session_keys)
        .where(_K.key == bindparam("k"), select(created.c.id).exists())
        .values(current_session_id=select(created.c.id).scalar_subquery())
        .returning(_K.key)
        .cte("point")
    )
    opened = union_all(select(bump), select(created)).cte("opened")
    # Only with the start: where neither common case applies, the general path counts it.
    counted = (
        update(inbox)
        .where(
            inbox.c.id == _INBOX_ID,
            NOT_CANCELED,
            select(countable.c.id).exists(),
            select(opened.c.id).exists(),
        )
        .values(status="processing", attempts=inbox.c.attempts + 1, updated_at=now)
        .returning(inbox.c.id)
        .cte("counted")
    )
    message = insert_message(opened)
    run = (
        insert(runs)
        .from_select(list(RUN_FIELDS), select(opened.c.id, *typed_params(runs, "r_", RUN_FIELDS[1:])))
        .returning(runs.c.id)
        .cte("run")
    )
    # A row even when nothing opened (`one`: its name, unique in a group of starts).
    one_row = select(literal(1).label("one")).subquery(one)
    return select(
        count(fence, "held"),
        count(countable, "countable"),
        count(counted, "counted"),
        watched(fence),
        *[opened.c[c.name] for c in sessions.c],
        select(message.c.seq).scalar_subquery().label("seq"),
        select(run.c.id).scalar_subquery().label("run_id"),
        count(expire, "expired"),
        count(point, "pointed"),
        *first_reads(opened, recall),
        lax_commit(),  # redone if a database crash loses it: the event is still pending
    ).select_from(one_row.outerjoin(opened, true()))


_NEW_SESSION = (
    "key",
    "generation",
    "channel",
    "status",
    "last_consolidated",
    "next_seq",
    "created_at",
    "updated_at",
    "last_active_at",
    "metadata",
)


START = {recall: Direct(start_statement(recall)) for recall in (None, False, True)}
