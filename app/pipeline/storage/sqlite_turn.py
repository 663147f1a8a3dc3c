"""SQLite: the transactions of an event's common way, each run whole in the link's thread.

`SqliteStore` hands these functions to its `LiteLink`: accepting events (and taking the
key's free lease with them), taking a lease with the key's next rows, counting an
attempt, a turn's start, a message appended while it runs, and its end. Each is one
`BEGIN IMMEDIATE … COMMIT` of plain statements on the link's connection, so it needs
none of the multi-statement tricks of `PostgresStore`: the transaction holds SQLite's
one write lock from its start, and what it reads is what it writes over.

They return rows (dicts, as `Lite` reads them); the store makes the port's records of
them on the event loop. A fenced write whose lease is gone raises `LeaseLost` and
writes nothing; a start that neither continues nor opens a session (another channel's
session is current, or a tool-call group is open) raises `GeneralPath`, having written
nothing, and the store runs the portable start instead.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, func, insert, select, update

from app.db.lite import Lite, Row
from app.db.models import INBOX_UNFINISHED, inbox, messages, one_of, outbox, runs, session_keys, sessions
from app.db.upsert import insert_ignore_for
from app.errors import LeaseLost, RowsCanceled
from app.memory.recall import recall_query
from app.pipeline.run_trace import UPDATE_RUN
from app.pipeline.storage import inbox_queries as q
from app.sessions import lease as leases
from app.sessions.store import BUMP_SEQ, CURRENT, OPEN_STATUSES, WINDOW, WINDOW_ALL

_K = session_keys.c


class GeneralPath(Exception):
    """Neither common start applies: nothing was written, the portable start runs."""


@functools.cache
def inserter(table: Table, names: tuple[str, ...], returning: str | None = None) -> Lite:
    """An insert of `names` into `table` (parameters named as the columns)."""
    statement = insert(table).values({name: bindparam(name, type_=table.c[name].type) for name in names})
    if returning is not None:
        statement = statement.returning(table.c[returning])
    return Lite(statement)


@functools.cache
def _run_trace(names: tuple[str, ...]) -> Lite:
    """The run row's trace (`UPDATE_RUN`): `names` from parameters prefixed `r_`."""
    return Lite(UPDATE_RUN.values({n: bindparam("r_" + n, type_=runs.c[n].type) for n in names}))


# --- leases and the inbox ---------------------------------------------------------------

_FENCE = Lite(leases.CHECK)
_TAKE = Lite(leases.take_free_or_new("sqlite").returning(_K.lease_fence))
_TAKE_EXPIRED = Lite(leases.TAKE_EXPIRED)
# The free lease only: a lease that is ours already is some other worker's.
_TAKE_FREE = Lite(leases.take_free_or_new("sqlite", ours=False).returning(_K.lease_fence))
_LET_GO = Lite(leases.LET_GO)
_RELEASE = Lite(leases.RELEASE["sqlite"].statement)
_ASK_UNFINISHED = Lite(leases.ASK_UNFINISHED)
_NEXT = Lite(q.NEXT_ROWS)
_INSERT = Lite(inbox.insert().values(q.INSERT_VALUES).returning(inbox.c.id))
_INSERT_NEW = Lite(
    insert_ignore_for("sqlite", inbox, ["channel", "external_id"])
    .values(q.INSERT_VALUES)
    .returning(inbox.c.id)
)
_ORIGINAL = Lite(q.ORIGINAL)
_COUNT = Lite(q.COUNT_UNFINISHED.values(status="processing", updated_at=bindparam("now")))
_DONE = Lite(
    update(inbox)
    .where(
        inbox.c.id.in_(bindparam("ids", expanding=True)),
        inbox.c.session_key == bindparam("k"),
        one_of(inbox.c.status, INBOX_UNFINISHED),
    )
    .values(
        status="done",
        updated_at=bindparam("now"),
        run_id=func.coalesce(bindparam("link", type_=inbox.c.run_id.type), inbox.c.run_id),
    )
)


def fence(conn: sqlite3.Connection, params: Mapping[str, Any]) -> None:
    """`LeaseLost` unless the lease `k`, `o`, `f` is still the key's (the transaction rolls back)."""
    if _FENCE.count(conn, params) != 1:
        raise LeaseLost(params["k"], params["f"])


def next_rows(conn: sqlite3.Connection, key: str, limit: int) -> list[Row]:
    return _NEXT.rows(conn, {"k": key, "limit": limit})


def accept(
    conn: sqlite3.Connection, values: Sequence[Mapping[str, Any]], take: Mapping[str, Any] | None
) -> tuple[list[Row | None], int | None, list[Row] | None]:
    """Store the events (a duplicate is left out: its original instead of None); with
    `take` (`k`, `o`, `exp`), one stored event's key's free lease too, and its rows."""
    originals: list[Row | None] = []
    stored = []
    for row in values:
        if row["external_id"] is None:
            stored.append(_INSERT.first(conn, row))
            originals.append(None)
            continue
        new = _INSERT_NEW.first(conn, row)
        stored.append(new)
        originals.append(
            None
            if new is not None
            else _ORIGINAL.first(conn, {"ch": row["channel"], "ext": row["external_id"]})
        )
    if take is None or stored[0] is None:
        return originals, None, None
    taken = _TAKE_FREE.first(conn, take)
    if taken is None:
        return originals, None, None
    return originals, taken["lease_fence"], next_rows(conn, take["k"], q.UPCOMING_LIMIT)


def take(conn: sqlite3.Connection, params: Mapping[str, Any]) -> tuple[int | None, bool, list[Row] | None]:
    """`leases.acquire` (free, new, ours, or expired: `took_over`) and, unless taken over, the rows."""
    taken = _TAKE.first(conn, params)
    if taken is not None:
        return taken["lease_fence"], False, next_rows(conn, params["k"], q.UPCOMING_LIMIT)
    expired = _TAKE_EXPIRED.first(conn, params)
    return (None if expired is None else expired["lease_fence"]), True, None


def release(conn: sqlite3.Connection, params: Mapping[str, Any]) -> bool:
    """`leases.release`: give the lease up; whether the key has unfinished rows."""
    released = _RELEASE.first(conn, params)
    if released is None:
        released = _ASK_UNFINISHED.first(conn, params)
    return released is not None and bool(next(iter(released.values())))


def count_attempt(conn: sqlite3.Connection, params: Mapping[str, Any]) -> list[int]:
    fence(conn, params)
    return [r["id"] for r in _COUNT.rows(conn, params)]


# --- a turn -------------------------------------------------------------------------------

_S = sessions.c
_CURRENT = Lite(CURRENT)
_CONTINUE = Lite(
    update(sessions)
    .where(_S.id == bindparam("sid"))
    .values(
        next_seq=_S.next_seq + 1,
        status="active",
        last_active_at=bindparam("now"),
        updated_at=bindparam("now"),
    )
    .returning(*_S)
)
_BUMP = Lite(BUMP_SEQ)
_EXPIRE = Lite(
    update(sessions)
    .where(_S.id == bindparam("sid"))
    .values(status="expired", closed_at=bindparam("now"), updated_at=bindparam("now"))
)
_GENERATION = Lite(
    select(func.coalesce(func.max(_S.generation), 0).label("last")).where(_S.key == bindparam("k"))
)
_CREATE = Lite(
    insert(sessions)
    .values(
        key=bindparam("k"),
        generation=bindparam("gen"),
        channel=bindparam("chan"),
        status="active",
        last_consolidated=0,
        next_seq=2,  # the user message is seq 1
        created_at=bindparam("now"),
        updated_at=bindparam("now"),
        last_active_at=bindparam("now"),
        metadata=bindparam("meta", type_=_S.metadata.type),
    )
    .returning(*_S)
)
_POINT = Lite(
    update(session_keys).where(_K.key == bindparam("k")).values(current_session_id=bindparam("sid"))
)
_WINDOW = Lite(WINDOW)
_WINDOW_ALL = Lite(WINDOW_ALL)
_RECALL = {with_user: Lite(recall_query(with_user)) for with_user in (False, True)}
_UNFINISHED_BUT = Lite(
    q.unfinished_rows()
    .where(inbox.c.id.not_in(bindparam("handled", expanding=True)))
    .limit(bindparam("limit"))
)


def _open(conn: sqlite3.Connection, p: Mapping[str, Any]) -> Row:
    """Continue the key's current session or open a new generation (`GeneralPath` if neither)."""
    now: datetime = p["now"]
    current = _CURRENT.first(conn, p)
    is_open = current is not None and current["status"] in OPEN_STATUSES
    if is_open and current is not None and current["channel"] == p["chan"]:
        if current["last_active_at"] >= p["cutoff"]:
            if current["tail_open"]:
                raise GeneralPath  # a tool-call group to close first
            opened = _CONTINUE.first(conn, {"sid": current["id"], "now": now})
            assert opened is not None
            return opened
        _EXPIRE.count(conn, {"sid": current["id"], "now": now})
    elif is_open:
        raise GeneralPath  # another channel's session is current
    generation = _GENERATION.rows(conn, p)[0]["last"] + 1
    opened = _CREATE.first(conn, {**p, "gen": generation, "meta": {}})
    assert opened is not None
    _POINT.count(conn, {"k": p["k"], "sid": opened["id"]})
    return opened


def start(
    conn: sqlite3.Connection,
    p: Mapping[str, Any],
    message: Mapping[str, Any],
    run: Mapping[str, Any],
    recall: tuple[bool, Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """A turn's start for one new row: fence, count (`tally`), session, user message, run,
    and what the run reads first (its window with the new message, and the recall)."""
    fence(conn, p)
    if p["tally"] and not _COUNT.rows(conn, {"ids": [p["inbox_id"]], "now": p["now"]}):
        raise RowsCanceled(frozenset([p["inbox_id"]]))
    session = _open(conn, p)
    seq = session["next_seq"] - 1
    row = {**message, "session_id": session["id"], "seq": seq, "created_at": p["now"]}
    inserter(messages, tuple(row)).count(conn, row)
    run_row = {**run, "session_id": session["id"]}
    run_id = inserter(runs, tuple(run_row), "id").rows(conn, run_row)[0]["id"]
    limit = p["wlimit"]
    window = (
        _WINDOW_ALL.rows(conn, {"sid": session["id"]})
        if limit is None
        else _WINDOW.rows(conn, {"sid": session["id"], "limit": limit})
    )
    recalled = None
    if recall is not None:
        with_user, params = recall
        recalled = _RECALL[with_user].rows(conn, {**params, "sid": session["id"]})
    return {"session": session, "seq": seq, "run_id": run_id, "window": window, "recalled": recalled}


def _append(
    conn: sqlite3.Connection, sid: int, rows: Sequence[Mapping[str, Any]], now: datetime
) -> list[int]:
    bumped = _BUMP.first(conn, {"sid": sid, "n": len(rows), "now": now})
    if bumped is None:
        raise RuntimeError(f"session {sid} is gone")
    first = bumped["next_seq"] - len(rows)
    numbered = [{**row, "session_id": sid, "seq": first + i, "created_at": now} for i, row in enumerate(rows)]
    inserter(messages, tuple(numbered[0])).many(conn, numbered)
    return [first + i for i in range(len(rows))]


def append(
    conn: sqlite3.Connection,
    p: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    handled: Sequence[int] | None,
) -> tuple[list[int], list[Row] | None]:
    """Messages appended during a run; with `handled`, the key's other unfinished rows."""
    fence(conn, p)
    seqs = _append(conn, p["sid"], rows, p["now"])
    if handled is None:
        return seqs, None
    return seqs, _UNFINISHED_BUT.rows(conn, {"k": p["k"], "handled": list(handled), "limit": q.PENDING_LIMIT})


def finish(
    conn: sqlite3.Connection,
    p: Mapping[str, Any],
    answer: Mapping[str, Any],
    reply: Mapping[str, Any],
    trace: Mapping[str, Any],
) -> dict[str, Any]:
    """A turn's end: the answer, its outbox row, the rows done, the run's trace; then the
    key's next rows, and with `release` the lease given up if there are none (and the
    `nk` key's free lease taken, with its rows, when `nk` is given)."""
    fence(conn, p)
    [seq] = _append(conn, p["sid"], [answer], p["now"])
    inserter(outbox, tuple(reply)).count(conn, reply)
    _DONE.count(conn, p)
    _run_trace(tuple(trace)).count(conn, {**{"r_" + n: v for n, v in trace.items()}, "run_id_": p["run"]})
    upcoming = next_rows(conn, p["k"], q.UPCOMING_LIMIT)
    released = bool(p["release"]) and not upcoming and _LET_GO.count(conn, p) == 1
    successor = None
    if released and p.get("nk") is not None:
        taken = _TAKE_FREE.first(conn, {"k": p["nk"], "o": p["o"], "exp": p["exp"]})
        if taken is not None:
            successor = (taken["lease_fence"], next_rows(conn, p["nk"], q.UPCOMING_LIMIT))
    return {"seq": seq, "upcoming": upcoming, "released": released, "successor": successor}
