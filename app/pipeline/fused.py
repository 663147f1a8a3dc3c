"""PostgreSQL: a turn's fenced writes as one statement, so one round trip and no BEGIN/COMMIT.

A turn writes twice: when it starts (inbox rows to `processing`, the user message, the run
row) and when it ends (the answer, its outbox row, inbox rows to `done`, the run trace).
Done as a transaction that is eight round trips each: BEGIN, the fence check, five
writes, COMMIT. Each round trip costs the gateway about as much CPU as the rest of the
statement's work (`bench/RESULTS.md`), so on PostgreSQL each commit is one statement of
data-modifying CTEs instead. One statement is one transaction, so it stays all or nothing.

The fence check is the first CTE (`UPDATE session_keys … RETURNING`, which row-locks the
key like `check_fence`) and every write is conditioned on its row, so a worker whose lease
was taken over writes nothing and learns it from the result. PostgreSQL runs the CTEs on
one snapshot; none of them reads a row another one writes, except through RETURNING.

SQLite has no data-modifying CTEs: there the same writes run one by one in a transaction
(`app.pipeline.turn`), which is what the tests compare this against on both backends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Table, bindparam, func, insert, literal, or_, select, true, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from app.db.models import inbox, messages, outbox, runs, session_keys, sessions
from app.errors import LeaseLost
from app.sessions.lease import SessionLease
from app.sessions.store import TAIL_OPEN, SessionState

_K = session_keys.c
# No parameter is named like a column of a table the statement updates: SQLAlchemy would
# take it for a value to SET.


def _fence() -> Any:
    """The `check_fence` update as a CTE: one row while the lease is ours, none after a takeover."""
    return (
        update(session_keys)
        .where(_K.key == bindparam("k"), _K.lease_owner == bindparam("o"), _K.lease_fence == bindparam("f"))
        .values(lease_fence=_K.lease_fence)
        .returning(_K.key)
        .cte("fence")
    )


def _params(table: Table, prefix: str, names: Sequence[str]) -> list[ColumnElement[Any]]:
    """Typed bound parameters `prefix + name` for `names` of `table`, in order."""
    return [bindparam(prefix + name, type_=table.c[name].type) for name in names]


_MESSAGE_FIELDS = ("role", "content", "parts", "tool_calls", "tool_call_id", "name", "event_id", "run_id")
_OUTBOX_FIELDS = (
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
)
_RUN_FIELDS = (
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
_RUN_TRACE = (
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


def _insert_message(bump: Any) -> Any:
    """The message row, numbered from the `bump` CTE's new `next_seq` (one message)."""
    return (
        insert(messages)
        .from_select(
            ["session_id", "seq", *_MESSAGE_FIELDS, "created_at"],
            select(
                bump.c.id,
                bump.c.next_seq - 1,
                *_params(messages, "m_", _MESSAGE_FIELDS),
                bindparam("now", type_=messages.c.created_at.type),
            ),
        )
        .returning(messages.c.seq)
        .cte("message")
    )


def _count(cte: Any, label: str) -> Any:
    return select(func.count()).select_from(cte).scalar_subquery().label(label)


def _finish_statement() -> Any:
    """The end of a turn: answer, outbox row, inbox rows done, run trace; one statement."""
    fence = _fence()
    held = select(fence.c.key).exists()
    bump = (
        update(sessions)
        .where(sessions.c.id == bindparam("sid"), held)
        .values(
            next_seq=sessions.c.next_seq + 1,
            last_active_at=bindparam("now"),
            updated_at=bindparam("now"),
        )
        .returning(sessions.c.id, sessions.c.next_seq)
        .cte("bump")
    )
    message = _insert_message(bump)
    landed = select(bump.c.id).exists()  # all or nothing: the rest only with the answer
    reply = (
        insert(outbox)
        .from_select(list(_OUTBOX_FIELDS), select(*_params(outbox, "o_", _OUTBOX_FIELDS)).where(landed))
        .returning(outbox.c.id)
        .cte("reply")
    )
    done = (
        update(inbox)
        .where(inbox.c.id == func.any(_INBOX_IDS), landed)
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
        .values({name: bindparam("r_" + name, type_=runs.c[name].type) for name in _RUN_TRACE})
        .returning(runs.c.id)
        .cte("trace")
    )
    return select(
        _count(fence, "held"),
        select(message.c.seq).scalar_subquery().label("seq"),
        _count(reply, "replies"),
        _count(done, "done"),
        _count(trace, "traced"),
    )


FINISH = _finish_statement()


def _start_statement() -> Any:
    """The start of a turn in the common case; writes nothing unless the case applies.

    The case: the key's current session is open, of the event's channel, active since
    `cutoff`, and its newest message leaves no tool-call group open. Then it is marked
    active and the user message, the run row and the inbox row's `processing` are
    written. Otherwise (`held` but no session) the caller takes the general path.
    """
    fence = _fence()
    held = select(fence.c.key).exists()
    current = select(_K.current_session_id).where(_K.key == bindparam("k")).scalar_subquery()
    bump = (
        update(sessions)
        .where(
            sessions.c.id == current,
            or_(sessions.c.status == "active", sessions.c.status == "suspended"),
            sessions.c.channel == bindparam("chan"),
            sessions.c.last_active_at >= bindparam("cutoff"),
            ~TAIL_OPEN,
            held,
        )
        .values(
            next_seq=sessions.c.next_seq + 1,
            status="active",
            last_active_at=bindparam("now"),
            updated_at=bindparam("now"),
        )
        .returning(*sessions.c)
        .cte("bump")
    )
    usable = select(bump.c.id).exists()
    message = _insert_message(bump)
    run = (
        insert(runs)
        .from_select(
            list(_RUN_FIELDS),
            select(
                bump.c.id,
                *_params(runs, "r_", _RUN_FIELDS[1:]),
            ),
        )
        .returning(runs.c.id)
        .cte("run")
    )
    processing = (
        update(inbox)
        .where(inbox.c.id == bindparam("inbox_id"), usable)
        .values(status="processing", attempts=inbox.c.attempts + 1, updated_at=bindparam("now"))
        .returning(inbox.c.id)
        .cte("processing")
    )
    one = select(literal(1).label("one")).subquery("one")  # a row even when `bump` has none
    return select(
        _count(fence, "held"),
        *[bump.c[c.name] for c in sessions.c],
        select(message.c.seq).scalar_subquery().label("seq"),
        select(run.c.id).scalar_subquery().label("run_id"),
        _count(processing, "processing"),
    ).select_from(one.outerjoin(bump, true()))


START = _start_statement()


def _lease(lease: SessionLease) -> dict[str, Any]:
    return {"k": lease.key, "o": lease.owner, "f": lease.fence}


@dataclass(frozen=True)
class Started:
    session: SessionState  # as it is after the statement: active, `next_seq` past the message
    seq: int  # the user message's
    run_id: int


async def start(
    conn: AsyncConnection,
    lease: SessionLease,
    *,
    inbox_id: int,
    channel: str,
    cutoff: datetime,
    now: datetime,
    message: Mapping[str, Any],
    run: Mapping[str, Any],
) -> Started | None:
    """Start a turn of one new event in one statement (see `_start_statement`).

    None when the common case does not apply and nothing was written; raises `LeaseLost`
    when the lease is no longer ours (nothing was written either).
    """
    params: dict[str, Any] = {
        **_lease(lease),
        "inbox_id": inbox_id,
        "chan": channel,
        "cutoff": cutoff,
        "now": now,
    }
    params.update({"m_" + name: message.get(name) for name in _MESSAGE_FIELDS})
    params.update({"r_" + name: run[name] for name in _RUN_FIELDS[1:]})
    row = (await conn.execute(START, params)).mappings().one()
    if row["held"] != 1:
        raise LeaseLost(lease.key, lease.fence)
    if row["id"] is None:
        return None
    session = replace(SessionState.from_row(row), tail_open=False)
    return Started(session=session, seq=row["seq"], run_id=row["run_id"])


async def finish(
    conn: AsyncConnection,
    lease: SessionLease,
    *,
    session_id: int,
    now: datetime,
    message: Mapping[str, Any],
    reply: Mapping[str, Any],
    inbox_ids: Sequence[int],
    link: int | None,
    run_id: int,
    trace: Mapping[str, Any],
) -> int:
    """End a turn in one statement (see `_finish_statement`); returns the answer's seq.

    Raises `LeaseLost`, having written nothing, when the lease is no longer ours.
    """
    params: dict[str, Any] = {
        **_lease(lease),
        "sid": session_id,
        "now": now,
        "inbox_ids": list(inbox_ids),
        "link": link,
        "run": run_id,
    }
    params.update({"m_" + name: message.get(name) for name in _MESSAGE_FIELDS})
    params.update({"o_" + name: reply[name] for name in _OUTBOX_FIELDS})
    params.update({"r_" + name: trace.get(name) for name in _RUN_TRACE})
    row = (await conn.execute(FINISH, params)).one()
    if row.held != 1:
        raise LeaseLost(lease.key, lease.fence)
    if row.seq is None:
        raise RuntimeError(f"session {session_id} of {lease.key!r} is gone")
    return int(row.seq)
