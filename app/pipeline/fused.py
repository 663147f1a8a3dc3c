"""PostgreSQL: a turn's fenced writes as one statement, so one round trip and no BEGIN/COMMIT.

A turn writes twice: when it starts (inbox rows to `processing`, the user message, the run
row) and when it ends (the answer, its outbox row, inbox rows to `done`, the run trace).
Done as a transaction that is about eight round trips each: BEGIN, the fence check, the
writes, COMMIT, and most of the gateway's CPU per event went into executing statements
(`bench/RESULTS.md`). On PostgreSQL each is one statement of data-modifying CTEs instead.
One statement is one transaction, so it stays all or nothing.

The fence check is the first CTE: the `check_fence` update at the end of a turn, a
locking read (`FOR UPDATE`) at its start. Either row-locks the key's row, so a takeover
happened before (then the CTE has no row) or waits for the commit. Every write is
conditioned on that row, so a worker whose lease was taken over writes nothing and
learns it from the result. All CTEs read the rows as they were before the statement;
what one writes, another sees only through its RETURNING.

The start also reads what the run needs first (its history window and memory recall),
and a message appended during a run (a tool call, a tool result) is one statement too.
The statements run on asyncpg directly (`app.db.direct`).

SQLite has no data-modifying CTEs: there the same writes run one by one in a transaction
(`app.pipeline.turn`), which is what the tests compare this against on both backends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.elements import ColumnElement

from app.db.direct import Direct, DirectConnection, rows_as_json
from app.db.engine import lax_commit
from app.db.models import inbox, messages, outbox, runs, session_keys, sessions
from app.errors import LeaseLost
from app.memory.recall import recall_query
from app.memory.store import Memory, memory_from_row
from app.pipeline.inbox import InboxRow, unfinished_rows
from app.pipeline.prefetch import (
    LIMIT,
    WATCHED,
    rows_from,
    rows_if_nobody_between,
    take_if_free_and_unlocked,
    upcoming,
)
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.store import TAIL_OPEN, SessionState, message_from_row, message_values

_K = session_keys.c
# No parameter is named like a column of a table the statement updates: SQLAlchemy would
# take it for a value to SET.


def _watched(fence: Any) -> Any:
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
    "sent_at",
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


def _count(cte: Any, label: str) -> Any:
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


def _finish_statement(*, hand_on: bool = False) -> Any:
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
        .from_select(list(_OUTBOX_FIELDS), select(*typed_params(outbox, "o_", _OUTBOX_FIELDS)).where(landed))
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
    successor = []
    if hand_on:
        key = bindparam("nk", type_=_K.key.type)
        taken = take_if_free_and_unlocked(key, when=select(fence.c.key).where(fence.c.released).exists())
        successor = [
            select(taken.c.lease_fence).scalar_subquery().label("successor_fence"),
            rows_if_nobody_between(taken, key).label("successor_upcoming"),
        ]
    return select(
        _count(fence, "held"),
        _watched(fence),
        select(message.c.seq).scalar_subquery().label("seq"),
        _count(reply, "replies"),
        _count(done, "done"),
        _count(trace, "traced"),
        upcoming(LIMIT, exclude=_INBOX_IDS).label("upcoming"),
        select(fence.c.released).scalar_subquery().label("released"),
        *successor,
    )


# By whether it hands the run slot on (`hand_on`).
FINISH = {hand_on: Direct(_finish_statement(hand_on=hand_on)) for hand_on in (False, True)}


# How many of the key's rows the boundary after a group's tool results looks at.
PENDING_LIMIT = 50


def _append_statement(lax: bool, pending: bool) -> Any:
    """One message appended during a run (a tool call, a tool result): fence, seq, row.

    With `pending` it also reads the key's unfinished rows but the turn's own (`handled`),
    the first `PENDING_LIMIT` as `Inbox.next_rows` reads them: what the boundary after a
    group's tool results looks at, so it needs no read of its own.
    """
    fence, _, message = _fenced_message()
    handled = bindparam("handled", type_=ARRAY(BigInteger))
    return select(
        _count(fence, "held"),
        _watched(fence),
        select(message.c.seq).scalar_subquery().label("seq"),
        *([upcoming(PENDING_LIMIT, exclude=handled).label("pending")] if pending else []),
        *([lax_commit()] if lax else []),
    )


_BOTH = (False, True)
APPEND = {(lax, pending): Direct(_append_statement(lax, pending)) for lax in _BOTH for pending in _BOTH}


# An open session: one a turn may continue (`_start_statement`).
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
    `_start_statement`): `window` and, unless `recall` is None, `recalled`. They join
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


def _start_statement(recall: bool | None) -> Any:
    """The start of a turn in the common cases; writes nothing when neither applies.

    Continue: the key's current session is open, of the event's channel, active since
    `cutoff`, and its newest message leaves no tool-call group open. It is marked active.
    Open: the key has no open session active since `cutoff` (none yet, closed by /new, or
    of this channel and idle too long: then it is expired here). A new generation is created and made current.
    Either way the user message, the run row and the inbox row's `processing` are written.
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
    held = select(fence.c.key).exists()
    now: Any = bindparam("now", type_=sessions.c.created_at.type)
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
    message = insert_message(opened)
    run = (
        insert(runs)
        .from_select(list(RUN_FIELDS), select(opened.c.id, *typed_params(runs, "r_", RUN_FIELDS[1:])))
        .returning(runs.c.id)
        .cte("run")
    )
    processing = (
        update(inbox)
        .where(inbox.c.id == bindparam("inbox_id"), select(opened.c.id).exists())
        .values(status="processing", attempts=inbox.c.attempts + 1, updated_at=now)
        .returning(inbox.c.id)
        .cte("processing")
    )
    one = select(literal(1).label("one")).subquery("one")  # a row even when nothing opened
    return select(
        _count(fence, "held"),
        _watched(fence),
        *[opened.c[c.name] for c in sessions.c],
        select(message.c.seq).scalar_subquery().label("seq"),
        select(run.c.id).scalar_subquery().label("run_id"),
        _count(processing, "processing"),
        _count(expire, "expired"),
        _count(point, "pointed"),
        *first_reads(opened, recall),
        lax_commit(),  # redone if a database crash loses it: the event is still pending
    ).select_from(one.outerjoin(opened, true()))


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


START = {recall: Direct(_start_statement(recall)) for recall in (None, False, True)}


async def _execute_fenced(
    conn: DirectConnection, statement: Direct, lease: SessionLease, params: dict[str, Any]
) -> Any:
    """Run `statement` with the lease's parameters; `LeaseLost` when its fence had no row."""
    params.update(k=lease.key, o=lease.owner, f=lease.fence)
    row = await statement.one(conn, params)
    if row["held"] != 1:
        raise LeaseLost(lease.key, lease.fence)
    return row


@dataclass(frozen=True)
class Started:
    session: SessionState  # as it is after the statement: active, `next_seq` past the message
    seq: int  # the user message's
    run_id: int
    window: list[ChatMessage]  # the newest `wlimit` messages before it, oldest first
    recalled: list[Memory] | None  # None: not asked
    watched: bool  # some replica's session bus watches the key (`WATCHED`)
    started_at: datetime  # the run's


@dataclass(frozen=True)
class Recall:
    """The recall a start statement runs: `recall_query(with_user)` with `params` (but `sid`)."""

    with_user: bool
    params: Mapping[str, Any]


# What `app.pipeline.accept_start` inserts of an inbox row's values, and how it names the
# parameters and the started session's columns (it also updates `sessions`, which has
# columns of the same names).
ACCEPTED = ("event_id", "channel", "external_id", "session_key", "payload", "created_at", "updated_at")
ACCEPTED_PREFIX, STARTED_PREFIX = "i_", "s_"


@dataclass(frozen=True)
class StartPlan:
    """What a turn's one-statement start writes and reads, but for the lease and the inbox
    row: `START` runs it for a worker, `app.pipeline.accept_start` with the event's accept."""

    now: datetime
    recall: bool | None  # the statement's variant: None, or `Recall.with_user`
    params: Mapping[str, Any]

    def accept_params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`app.pipeline.accept_start`'s parameters: the inbox row's `values`
        (`Inbox._values`, prefixed `ACCEPTED_PREFIX`) and the plan's."""
        return {**{ACCEPTED_PREFIX + name: values[name] for name in ACCEPTED}, **self.params}

    def started_on_accept(self, row: Mapping[str, Any]) -> Started:
        """The start `app.pipeline.accept_start`'s result `row` reports."""
        return self.started(row, {c.name: row[STARTED_PREFIX + c.name] for c in sessions.c})

    def started(self, row: Mapping[str, Any], session: Mapping[str, Any]) -> Started:
        """The start a statement's result `row` reports, the session's columns in `session`."""
        return Started(
            session=replace(SessionState.from_row(session), tail_open=False),
            seq=row["seq"],
            run_id=row["run_id"],
            window=[message_from_row(m) for m in row["window"]],
            recalled=None if self.recall is None else [_memory(m) for m in row["recalled"]],
            watched=bool(row["watched"]),
            started_at=self.now,
        )


def plan_start(
    *,
    channel: str,
    cutoff: datetime,
    now: datetime,
    message: Mapping[str, Any],
    run: Mapping[str, Any],
    window_limit: int | None,
    recall: Recall | None,
) -> StartPlan:
    """The start of a turn of one new event of `channel` (see `_start_statement`)."""
    params: dict[str, Any] = {
        "chan": channel,
        "cutoff": cutoff,
        "now": now,
        "meta": {},
        "wlimit": window_limit,
    }
    params.update({"m_" + name: message.get(name) for name in MESSAGE_FIELDS})
    params.update({"r_" + name: run[name] for name in RUN_FIELDS[1:]})
    if recall is not None:
        params.update(recall.params)
    return StartPlan(now, None if recall is None else recall.with_user, params)


async def start(
    conn: DirectConnection, lease: SessionLease, inbox_id: int, plan: StartPlan
) -> Started | None:
    """Start a turn of one new event, the inbox row `inbox_id`, under `lease` in one
    statement (`_start_statement`, `plan_start`).

    None when neither common case applies and nothing was written; raises `LeaseLost`
    when the lease is no longer ours (nothing was written either).
    """
    row = await _execute_fenced(conn, START[plan.recall], lease, {**plan.params, "inbox_id": inbox_id})
    if row["id"] is None:
        return None
    return plan.started(row, row)


def stored_window(started: Started, user: ChatMessage) -> list[ChatMessage]:
    """The rows `SessionStore.load_window` would read now, oldest first, the new user message last.

    `started` read the newest `wlimit` messages after `last_consolidated` before the
    statement; with `wlimit=max_messages` the newest `max_messages` of these are the read's.
    """
    return [*started.window, message_from_row({**message_values(user, None), "seq": started.seq})]


def _memory(row: dict[str, Any]) -> Memory:
    """A recalled entry from its JSON object (times are ISO strings there)."""
    return memory_from_row({**row, "updated_at": datetime.fromisoformat(row["updated_at"])})


@dataclass(frozen=True)
class Appended:
    seq: int  # the message's
    watched: bool  # some replica's session bus watches the key (`WATCHED`)
    # The key's unfinished rows but `handled` (`_append_statement`); None: not asked.
    pending: list[InboxRow] | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class Finished(Appended):
    # The key's next unfinished rows (`app.pipeline.prefetch`): the first `LIMIT`, but
    # those the statement finished.
    upcoming: list[InboxRow]
    released: bool = False  # the statement released the lease (asked to, and no rows left)
    # With a `successor`: its lease, when the statement released ours and took it, and its
    # next rows when they could be read with it (None: read them).
    successor: SessionLease | None = None
    successor_rows: list[InboxRow] | None = None


@dataclass(frozen=True)
class Successor:
    """The key whose lease a releasing turn's end takes for the run slot it frees (`hand_on`)."""

    key: str
    expires: datetime


async def finish(
    conn: DirectConnection,
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
    release: bool = False,
    successor: Successor | None = None,
) -> Finished:
    """End a turn in one statement (see `_finish_statement`).

    With `release`, the lease is released too when the key has nothing left to do
    (`Finished.released`); then with a `successor` the statement also takes that key's
    free lease (`Finished.successor`). Raises `LeaseLost`, having written nothing, when
    the lease is no longer ours.
    """
    params: dict[str, Any] = {
        "release": release,
        "sid": session_id,
        "now": now,
        "inbox_ids": list(inbox_ids),
        "link": link,
        "run": run_id,
    }
    params.update({"m_" + name: message.get(name) for name in MESSAGE_FIELDS})
    params.update({"o_" + name: reply[name] for name in _OUTBOX_FIELDS})
    params.update({"r_" + name: trace.get(name) for name in _RUN_TRACE})
    if successor is not None:
        params.update(nk=successor.key, exp=successor.expires)
    row = await _execute_fenced(conn, FINISH[successor is not None], lease, params)
    taken = None
    if successor is not None and row["successor_fence"] is not None:
        taken = SessionLease(successor.key, lease.owner, row["successor_fence"])
    next_rows = row["successor_upcoming"] if taken is not None else None
    return Finished(
        _appended_seq(row, session_id, lease),
        row["watched"],
        upcoming=rows_from(row["upcoming"]),
        released=bool(row["released"]),
        successor=taken,
        successor_rows=None if next_rows is None else rows_from(next_rows),
    )


async def append(
    conn: DirectConnection,
    lease: SessionLease,
    *,
    session_id: int,
    now: datetime,
    message: Mapping[str, Any],
    lax: bool,
    handled: Sequence[int] | None = None,
) -> Appended:
    """Append one message in one statement (`lax`: see `lax_commit`).

    With `handled` (the turn's inbox row ids) it also reads the key's other unfinished
    rows (`Appended.pending`). Raises `LeaseLost`, having written nothing, when the lease
    is no longer ours.
    """
    params: dict[str, Any] = {"sid": session_id, "now": now}
    params.update({"m_" + name: message.get(name) for name in MESSAGE_FIELDS})
    if handled is not None:
        params["handled"] = list(handled)
    row = await _execute_fenced(conn, APPEND[lax, handled is not None], lease, params)
    pending = None if handled is None else rows_from(row["pending"])
    return Appended(_appended_seq(row, session_id, lease), row["watched"], pending=pending)


def _appended_seq(row: Any, session_id: int, lease: SessionLease) -> int:
    if row["seq"] is None:
        raise RuntimeError(f"session {session_id} of {lease.key!r} is gone")
    return int(row["seq"])
