"""Engine creation for PostgreSQL (asyncpg) and SQLite (aiosqlite)."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

from sqlalchemy import event, func, true
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.config import Settings
from app.db.lite import PRAGMAS


def create_engine(settings: Settings) -> AsyncEngine:
    url = settings.database_url
    if url.startswith("sqlite"):
        # One writer at a time is SQLite's nature; WAL lets readers run beside it and
        # busy_timeout makes writers queue instead of failing with "database is locked".
        engine = create_async_engine(url)

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            for pragma in PRAGMAS:  # the same on the pipeline store's own connection
                cur.execute(pragma)
            cur.close()

        return engine
    # No overflow: overflow connections are closed whenever the pool is full again, and
    # under steady load that meant a new connection (and every statement prepared anew
    # on it) several times a second. The pool opens up to `db_pool_size` connections as
    # needed and keeps them.
    engine = create_async_engine(
        url, pool_size=settings.db_pool_size, max_overflow=0, connect_args=driver_connect_args(settings)
    )
    _ping_idle_connections(engine, IDLE_PING_SECONDS)
    return engine


def driver_connect_args(settings: Settings) -> dict[str, Any]:
    """asyncpg's arguments for every PostgreSQL connection: the pool's and the migrations'."""
    if settings.is_sqlite:
        return {}
    # A bounded connection attempt: during an outage or a failover a request waits this
    # long at most before it is answered 503 (asyncpg's default is a minute).
    args: dict[str, Any] = {"timeout": settings.db_connect_timeout_seconds}
    # asyncpg prepares (and PostgreSQL plans) a statement larger than this on every run
    # instead of keeping it (default 15 KiB): the ends of four turns in one statement
    # (`pg_finish_group`, ~25 KB) were planned on every call, 1 ms each.
    args["max_cacheable_statement_size"] = 64 * 1024
    if settings.database_pooler == "pgbouncer":
        args.update(pgbouncer_connect_args())
    return args


def pgbouncer_connect_args() -> dict[str, Any]:
    """No named prepared statement on a pooled connection (PgBouncer, transaction mode).

    PgBouncer hands a server connection to another client at the end of every
    transaction, and a statement that is one round trip outside a transaction is one;
    a statement prepared under a name on one server connection is then missing (or
    taken) on the next. asyncpg's cache off (`statement_cache_size=0`) makes its own
    statements (`Direct`, type introspection) unnamed, and asyncpg parses an unnamed one
    again in the same message group as its execution. SQLAlchemy's cache off
    (`prepared_statement_cache_size=0`) and the empty name from
    `prepared_statement_name_func` make SQLAlchemy's statements unnamed as well.
    SQLAlchemy's documented recipe (a uuid per statement) still failed here: on an
    autocommit connection the prepare and the execution are two transactions, and
    PgBouncer 1.18 sent them to different servers (about half of 1,000 statements from
    20 tasks failed with `prepared statement "__asyncpg_…__" does not exist`).
    """
    return {
        "statement_cache_size": 0,
        "prepared_statement_cache_size": 0,
        "prepared_statement_name_func": lambda: "",
    }


IDLE_PING_SECONDS = 10.0


def _ping_idle_connections(engine: AsyncEngine, idle: float) -> None:
    """Ping a pooled connection before use only if it sat idle for `idle` seconds.

    `pool_pre_ping` pings on every checkout: a round trip per transaction, about a fifth
    of a turn's gateway time. A connection in steady use needs no ping; one that idled
    (across a database restart or a dropped TCP connection) is checked, and a dead one
    is replaced (`DisconnectionError` makes the pool retry with a new connection). A
    restart under load still fails the one statement that finds its connection dead;
    the pool is then invalidated and the work is retried (inbox rows, outbox rows, the
    platform's redelivery of an unanswered webhook).
    """

    @event.listens_for(engine.sync_engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        last = record.info.get("last_used")
        if last is not None and time.monotonic() - last < idle:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"idle connection failed its ping: {exc}") from exc

    @event.listens_for(engine.sync_engine, "checkin")
    def _checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["last_used"] = time.monotonic()


_AUTOCOMMIT: weakref.WeakKeyDictionary[AsyncEngine, AsyncEngine] = weakref.WeakKeyDictionary()


def autocommit(engine: AsyncEngine) -> AsyncEngine:
    """The same pool for work that is one statement: a read, or one atomic write.

    No BEGIN/COMMIT round trips around it; a write commits when the statement ends.
    Made once per engine: making it registers event listeners, too slow for every lease
    call.
    """
    found = _AUTOCOMMIT.get(engine)
    if found is None:
        sync = engine.sync_engine.execution_options(isolation_level="AUTOCOMMIT")
        found = _SqliteAutocommitEngine(sync) if engine.dialect.name == "sqlite" else AsyncEngine(sync)
        _AUTOCOMMIT[engine] = found
    return found


_START_GRACE_SECONDS = 1.0


class _CancelSafeConnection(AsyncConnection):
    """An AsyncConnection whose start is not cut in half by a cancellation.

    With an isolation level among its execution options, a connection sets it on every
    checkout, inside SQLAlchemy's `Connection.__init__`, after the pool handed the DBAPI
    connection out. On aiosqlite that is a round trip to the driver's thread: a task
    cancelled there (`/stop`, a lost lease, shutdown) left `__init__` with the pooled
    connection checked out and referenced by nothing, and the garbage collector later
    "cleaned up a non-checked-in connection" (SAWarning) instead of the pool getting it
    back. Here the start runs to its end in its own task; a cancellation then closes the
    connection (back to the pool) and propagates.
    """

    async def start(self, is_ctxmanager: bool = False) -> AsyncConnection:
        starting = asyncio.ensure_future(super().start(is_ctxmanager))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            # The isolation-level round trip takes microseconds; a start still unfinished
            # after a moment is waiting for a free pooled connection, which is safe to
            # cancel, and a cancelled task should not wait out the pool's timeout.
            await asyncio.wait({starting}, timeout=_START_GRACE_SECONDS)
            if not starting.done():
                starting.cancel()
            try:
                await starting
            except BaseException:  # nothing was checked out: the cancellation wins
                pass
            else:
                await asyncio.shield(self.close())
            raise


class _SqliteAutocommitEngine(AsyncEngine):
    __slots__ = ()
    _connection_cls = _CancelSafeConnection


def lax_commit() -> Any:
    """PostgreSQL: a column that makes its statement's transaction commit without a WAL flush.

    `set_config('synchronous_commit', 'off', true)` evaluated by the statement itself: no
    extra round trip, and it lasts to the end of that transaction only. Put it in the
    RETURNING (or select list) of a write whose loss in a *database* crash is harmless
    because it is redone: a lease taken or given up, the start of a turn (its inbox row
    is still pending then, so the event is handled again). PostgreSQL writes the WAL in
    order, so the next synchronous commit of any transaction (a turn's end, which records
    the answer and marks the event done, or an accepted event) flushes these as well:
    nothing that has left the system (an acknowledged event, a delivered reply) depends
    on an unflushed commit. A crash of our own process loses nothing committed.
    """
    return func.set_config("synchronous_commit", "off", true()).label("lax_commit")
