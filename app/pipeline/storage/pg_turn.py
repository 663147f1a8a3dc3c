"""PostgreSQL statements of a turn (the catalogue `PostgresStore` runs): one round trip each.

A turn writes when it starts (the user message, the run row, the session continued or a
new generation opened), while it runs (each tool call and result) and when it ends (the
answer, its outbox row, inbox rows `done`, the run trace, maybe the lease given up). As
transactions these are about eight round trips each (BEGIN, the fence check, the writes,
COMMIT); here each is one statement of data-modifying CTEs. One statement is one
transaction, so it stays all or nothing.

The fence check is the first CTE: the `check_fence` update at the end of a turn, a
locking read (`FOR UPDATE`) at its start. Either row-locks the key's row, so a takeover
happened before (then the CTE has no row) or waits for the commit. Every write is
conditioned on that row, so a worker whose lease was taken over writes nothing and
learns it from the result. All CTEs read the rows as they were before the statement;
what one writes, another sees only through its RETURNING.

The start also reads what the run needs first (its history window and memory recall).
The statements run on asyncpg directly (`app.db.direct`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import ColumnElement

from app.db.direct import Direct
from app.db.engine import lax_commit
from app.db.models import INBOX_UNFINISHED, inbox, messages, one_of, outbox, runs, session_keys, sessions
from app.pipeline.storage.inbox_queries import NOT_CANCELED, PENDING_LIMIT, unfinished_rows
from app.pipeline.storage.pg_inbox import (
    LIMIT,
    WATCHED,
    rows_if_nobody_between,
    take_if_free_and_unlocked,
    upcoming,
)

_K = session_keys.c
# No parameter is named like a column of a table the statement updates: SQLAlchemy would
# take it for a value to SET.


def watched(fence: Any) -> Any:
    return func.coalesce(select(fence.c.watched).scalar_subquery(), False).label("watched")


def _fence(*, release: bool = False) -> Any:
    """The `check_fence` update as a CTE: one row while the lease is ours, none after a takeover.

    With `release`, it also gives the lease up (as `leases.release`) when the `release`
    parameter is true and the key has no unfinished rows but the `inbox_ids` the
    statement finishes; `released` tells whether it did.
    """
    check = update(session_keys).where(
        _K.key == bindparam("k"), _K.lease_owner == bindparam("o"), _K.lease_fence == bindparam("f")
    )
    if not release:
        return check.values(lease_fence=_K.lease_fence).returning(_K.key, WATCHED).cte("fence")
    idle = ~unfinished_rows().where(inbox.c.id != func.all(_INBOX_IDS)).exists()
    let_go = and_(bindparam("release", type_=Boolean), idle)
    return (
        check.values(
            lease_owner=case((let_go, None), else_=_K.lease_owner),
            lease_expires_at=case((let_go, None), else_=_K.lease_expires_at),
        )
        .returning(_K.key, WATCHED, _K.lease_owner.is_(None).label("released"))
        .cte("fence")
    )


def typed_params(table: Table, prefix: str, names: Sequence[str]) -> list[ColumnElement[Any]]:
    """Typed bound parameters `prefix + name` for `names` of `table`, in order."""
    return [bindparam(prefix + name, type_=table.c[name].type) for name in names]


MESSAGE_FIELDS = ("role", "content", "parts", "tool_calls", "tool_call_id", "name", "event_id", "run_id")
OUTBOX_FIELDS = (
    "message_id",
    "session_key",
    "session_id",
    "run_id",
    "event_id",
    "channel",
    "chat_id",
    "payload",
    "status",
    "attempts",
    "next_attempt_at",
    "created_at",
    "sent_at",
    "trace_context",
)
RUN_FIELDS = (
    "session_id",
    "session_key",
    "event_ids",
    "provider",
    "model",
    "tool_calls",
    "started_at",
    "outcome",
    "details",
    "iterations",
    "prompt_tokens",
    "completion_tokens",
)
RUN_TRACE = (
    "model",
    "tool_calls",
    "iterations",
    "prompt_tokens",
    "completion_tokens",
    "outcome",
    "error",
    "details",
    "event_ids",
    "finished_at",
    "duration_ms",
)
_INBOX_IDS = bindparam("inbox_ids", type_=ARRAY(BigInteger))


def insert_message(bump: Any) -> Any:
    """The message row, numbered from the `bump` CTE's new `next_seq` (one message)."""
    return (
        insert(messages)
        .from_select(
            ["session_id", "seq", *MESSAGE_FIELDS, "created_at"],
            select(
                bump.c.id,
                bump.c.next_seq - 1,
                *typed_params(messages, "m_", MESSAGE_FIELDS),
                bindparam("now", type_=messages.c.created_at.type),
            ),
        )
        .returning(messages.c.seq)
        .cte("message")
    )


def count(cte: Any, label: str) -> Any:
    """How many rows `cte` returned.

    Every CTE is counted in the result. SQLAlchemy leaves out a CTE that nothing refers
    to, and PostgreSQL runs each data-modifying CTE regardless.
    """
    return select(func.count()).select_from(cte).scalar_subquery().label(label)


def _fenced_message(*, release: bool = False) -> tuple[Any, Any, Any]:
    """The fence check, the session's seq bump under it and the one message row numbered by it."""
    fence = _fence(release=release)
    bump = (
        update(sessions)
        .where(sessions.c.id == bindparam("sid"), select(fence.c.key).exists())
        .values(
            next_seq=sessions.c.next_seq + 1,
            last_active_at=bindparam("now"),
            updated_at=bindparam("now"),
        )
        .returning(sessions.c.id, sessions.c.next_seq)
        .cte("bump")
    )
    return fence, bump, insert_message(bump)


def finish_statement(*, hand_on: bool = False) -> Any:
    """The end of a turn: answer, outbox row, inbox rows done, run trace; one statement.

    With the `release` parameter it also releases the lease if nothing is left to do for
    the key (`_fence`): the worker then needs no statement of its own for that.

    `hand_on`: when it released the lease, it also takes the free lease of the `nk` key
    (the next key waiting for the worker's run slot) for `o` until `exp`, unless another
    transaction has that key's row locked, and reads that key's next rows, as
    `prefetch.TAKE` would (`successor_fence`, `successor_upcoming`).
    """
    fence, bump, message = _fenced_message(release=True)
    landed = select(bump.c.id).exists()  # all or nothing: the rest only with the answer
    reply = (
        insert(outbox)
        .from_select(list(OUTBOX_FIELDS), select(*typed_params(outbox, "o_", OUTBOX_FIELDS)).where(landed))
        .returning(outbox.c.id)
        .cte("reply")
    )
    done = (
        update(inbox)
        # The key and `unfinished` (which the turn's rows are) as well as the ids: the rows
        # then come from the partial index of unfinished rows in any plan. By the ids alone,
        # a prepared statement's generic plan made while the table was small scanned it all.
        .where(
            inbox.c.id == func.any(_INBOX_IDS),
            inbox.c.session_key == bindparam("k"),
            one_of(inbox.c.status, INBOX_UNFINISHED),
            landed,
        )
        .values(
            status="done",
            updated_at=bindparam("now"),
            run_id=func.coalesce(bindparam("link", type_=inbox.c.run_id.type), inbox.c.run_id),
        )
        .returning(inbox.c.id)
        .cte("done")
    )
    trace = (
        update(runs)
        .where(runs.c.id == bindparam("run"), landed)
        .values({name: bindparam("r_" + name, type_=runs.c[name].type) for name in RUN_TRACE})
        .returning(runs.c.id)
        .cte("trace")
    )
    successor = []
    if hand_on:
        key = bindparam("nk", type_=_K.key.type)
        taken = take_if_free_and_unlocked(key, when=select(fence.c.key).where(fence.c.released).exists())
        successor = [
            select(taken.c.lease_fence).scalar_subquery().label("successor_fence"),
            rows_if_nobody_between(taken, key).label("successor_upcoming"),
        ]
    return select(
        count(fence, "held"),
        watched(fence),
        select(message.c.seq).scalar_subquery().label("seq"),
        count(reply, "replies"),
        count(done, "done"),
        count(trace, "traced"),
        upcoming(LIMIT, exclude=_INBOX_IDS).label("upcoming"),
        select(fence.c.released).scalar_subquery().label("released"),
        *successor,
    )


# By whether it hands the run slot on (`hand_on`).
FINISH = {hand_on: Direct(finish_statement(hand_on=hand_on)) for hand_on in (False, True)}


def _append_statement(lax: bool, pending: bool) -> Any:
    """One message appended during a run (a tool call, a tool result): fence, seq, row.

    With `pending` it also reads the key's unfinished rows but the turn's own (`handled`),
    the first `PENDING_LIMIT` as `Inbox.next_rows` reads them: what the boundary after a
    group's tool results looks at, so it needs no read of its own.
    """
    fence, _, message = _fenced_message()
    handled = bindparam("handled", type_=ARRAY(BigInteger))
    return select(
        count(fence, "held"),
        watched(fence),
        select(message.c.seq).scalar_subquery().label("seq"),
        *([upcoming(PENDING_LIMIT, exclude=handled).label("pending")] if pending else []),
        *([lax_commit()] if lax else []),
    )


_BOTH = (False, True)
APPEND = {(lax, pending): Direct(_append_statement(lax, pending)) for lax in _BOTH for pending in _BOTH}


def _count_attempt_statement() -> Any:
    """Rows `processing` with one more attempt, under the lease; committed without a WAL
    flush (`lax_commit`: only a database crash could lose the count, never our own).
    Rows no longer unfinished (canceled meanwhile) are left alone; `ids`: those counted."""
    fence = _fence()
    counted = (
        update(inbox)
        .where(
            inbox.c.id == func.any(_INBOX_IDS),
            NOT_CANCELED,
            select(fence.c.key).exists(),
        )
        .values(status="processing", attempts=inbox.c.attempts + 1, updated_at=func.now())
        .returning(inbox.c.id)
        .cte("counted")
    )
    ids = select(func.array_agg(counted.c.id)).scalar_subquery().label("ids")
    return select(count(fence, "held"), count(counted, "counted"), ids, lax_commit())


COUNT_ATTEMPT = Direct(_count_attempt_statement())
