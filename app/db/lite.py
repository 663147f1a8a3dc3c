"""SQLite: a transaction's statements run together, on a connection and a thread of their own.

On aiosqlite every statement, fetch, cursor close and commit is a hop from the event loop
to the driver's thread and back, and every execution goes through SQLAlchemy's execution
path: a turn on the portable store was ~40 statements, ≈ 250-300 µs of Python each, and
the server's main thread spent a third of its CPU in system calls waking up for the
results (`bench/RESULTS.md`, "SQLite"). Here a whole transaction is one plain function
run in the link's thread (`LiteLink.run`): one hop there and back, the statements executed
by the `sqlite3` module directly.

A `Lite` statement is a Core statement compiled once for SQLite, as `app.db.direct`'s are
for asyncpg (the same `BindPlan`: the SQL text, the order of its parameters and each
one's type processor, UTC times and JSON), with the result columns' processors. So the
rows written and read are exactly the ones SQLAlchemy writes and reads, and the schema
stays defined once. An "expanding" `IN` parameter (a list) becomes
`IN (SELECT value FROM json_each(?))`: one prepared statement for any length.

The link's connection is one more connection to the same file, beside the engine's pool:
SQLite has one writer at a time, and the writes queue on its lock (`busy_timeout`). Its
transactions start with `BEGIN IMMEDIATE`, so they take the write lock before they read
and never fail halfway for a lock another connection took first.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from queue import Empty, SimpleQueue
from typing import Any, TypeVar, cast

from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import ClauseElement, Executable

from app.db.direct import BindPlan

T = TypeVar("T")

_DIALECT = sqlite.dialect()
WAL = "PRAGMA journal_mode=WAL"  # kept in the file: the migration sets it first (migrations/env.py)
BUSY_TIMEOUT = "PRAGMA busy_timeout=30000"
PRAGMAS = (
    WAL,
    BUSY_TIMEOUT,
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=ON",
)
"""Every SQLite connection's settings (the engine's pool sets them too)."""

Row = dict[str, Any]


@dataclass(frozen=True)
class _Plan:
    binds: BindPlan
    columns: tuple[str, ...] | None  # None: take the names from the cursor
    results: tuple[Callable[[Any], Any] | None, ...]


def _json_list(process: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """An expanding parameter's processor: its values, each processed, as one JSON array."""
    return lambda values: json.dumps([process(v) if process is not None else v for v in values])


class Lite:
    """A Core statement compiled once for SQLite, run on a `sqlite3` connection (see the module)."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._plan: _Plan | None = None

    def plan(self) -> _Plan:
        if self._plan is None:
            compiled = cast(Any, cast(ClauseElement, self.statement).compile(dialect=_DIALECT))
            binds = BindPlan.of(compiled, _DIALECT)
            sql, processors = binds.sql, list(binds.processors)
            for i, name in enumerate(binds.names):
                if compiled.binds[name].expanding:
                    sql = sql.replace(f"__[POSTCOMPILE_{name}]", "SELECT value FROM json_each(?)")
                    processors[i] = _json_list(processors[i])
            columns = None
            results: list[Callable[[Any], Any] | None] = []
            if compiled._result_columns:
                columns = tuple(entry.keyname for entry in compiled._result_columns)
                results = [
                    entry.type.dialect_impl(_DIALECT).result_processor(_DIALECT, None)
                    for entry in compiled._result_columns
                ]
            binds = replace(binds, sql=sql, processors=tuple(processors))
            self._plan = _Plan(binds, columns, tuple(results))
        return self._plan

    def rows(self, conn: sqlite3.Connection, params: Mapping[str, Any]) -> list[Row]:
        """Run it; the result rows as dicts by column name (none for a statement without)."""
        plan = self.plan()
        cursor = conn.execute(plan.binds.sql, plan.binds.args(params))
        fetched = cursor.fetchall()
        if not fetched:
            return []
        if plan.columns is None:
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in fetched]
        found = []
        for row in fetched:
            found.append(
                {
                    name: (value if process is None or value is None else process(value))
                    for name, process, value in zip(plan.columns, plan.results, row, strict=True)
                }
            )
        return found

    def first(self, conn: sqlite3.Connection, params: Mapping[str, Any]) -> Row | None:
        found = self.rows(conn, params)
        return found[0] if found else None

    def count(self, conn: sqlite3.Connection, params: Mapping[str, Any]) -> int:
        """Run a statement without result rows; the number of rows it changed."""
        plan = self.plan()
        return conn.execute(plan.binds.sql, plan.binds.args(params)).rowcount

    def many(self, conn: sqlite3.Connection, params: Sequence[Mapping[str, Any]]) -> None:
        """Run a statement without result rows once per parameter set."""
        plan = self.plan()
        conn.executemany(plan.binds.sql, [plan.binds.args(p) for p in params])


def transaction(work: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
    """`work` in one transaction that holds the write lock from its start; all or nothing."""

    def run(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    return run


_Job = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[[sqlite3.Connection], Any]]


class LiteLink:
    """A `sqlite3` connection to the file at `path` and the thread that uses it (see the module).

    `run(work)` runs `work(connection)` there and returns its result (or raises its
    exception, a `sqlite3.Error` as SQLAlchemy's `DBAPIError` like any other statement's).
    Jobs run one at a time in the order they came; the results of jobs that queued up
    together go back to the event loop with one wake-up.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._jobs: SimpleQueue[_Job | None] = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=_work, args=(self.path, self._jobs), name="chatgate-sqlite", daemon=True
                )
                self._thread.start()
                # A link nobody closed stops its thread when it is collected.
                weakref.finalize(self, self._jobs.put, None)

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._thread is None:
            self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, work))
        return await future

    async def close(self) -> None:
        """Finish the queued jobs, close the connection, end the thread (a later `run`
        starts a new one)."""
        with self._lock:
            thread, jobs = self._thread, self._jobs
            if thread is None:
                return
            self._thread, self._jobs = None, SimpleQueue()
        jobs.put(None)
        await asyncio.to_thread(thread.join)


def _work(path: str, jobs: SimpleQueue[_Job | None]) -> None:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=256)
    try:
        for pragma in PRAGMAS:
            conn.execute(pragma)
        stopping = False
        while not stopping:
            batch = [jobs.get()]
            while True:
                try:
                    batch.append(jobs.get_nowait())
                except Empty:
                    break
            done: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
            for job in batch:
                if job is None:
                    stopping = True
                    continue
                loop, future, work = job
                if future.cancelled():  # a benign race: at worst the job runs for nobody
                    continue
                try:
                    outcome: tuple[asyncio.Future[Any], bool, Any] = (future, True, work(conn))
                except sqlite3.Error as exc:
                    wrapped = DBAPIError.instance(None, None, exc, sqlite3.Error)
                    outcome = (future, False, wrapped)
                except BaseException as exc:
                    outcome = (future, False, exc)
                done.setdefault(loop, []).append(outcome)
            for loop, outcomes in done.items():
                try:
                    loop.call_soon_threadsafe(_deliver, outcomes)
                except RuntimeError:  # that loop is closed: nobody waits any more
                    pass
    finally:
        conn.close()


def _deliver(outcomes: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in outcomes:
        if future.done():
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)
