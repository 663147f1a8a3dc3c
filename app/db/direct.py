"""PostgreSQL: the hottest statements run on the pooled connection's asyncpg driver.

SQLAlchemy's per-execution work (the execution context, parameter construction through
the compiled statement, result metadata, the greenlet hop) was about a third of a loaded
server's CPU, more than asyncpg's own. A `Direct` statement keeps what SQLAlchemy
computes once — the SQL text with its casts, the positional order of the parameters and
each parameter's type processor (JSON, UTC times) — and the pool (checkout, the idle
ping, invalidation), and skips the rest: the arguments go straight to asyncpg, whose
prepared-statement cache holds the statement, and its records come back as rows.

Only for statements whose result columns need no result processing beyond the
connection's JSON codecs, which SQLAlchemy's dialect installs on every connection. Only
on an autocommit connection (`app.db.engine.autocommit`): in a transaction of
SQLAlchemy's, and on SQLite, the statement runs through SQLAlchemy as usual, so it is
never taken out of the caller's transaction.

Work that runs nothing but `Direct` statements checks its connection out with
`connect(engine)`: on PostgreSQL that is the pool's connection alone (`Pooled`), without
SQLAlchemy's `Connection` around it, which cost about 50 µs per checkout (a few per
event); elsewhere it is `engine.connect()`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import JSON, func, literal_column, select
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.util import greenlet_spawn


class Pooled:
    """A pooled PostgreSQL connection checked out for `Direct` statements only (`connect`)."""

    def __init__(self, fairy: PoolProxiedConnection, dialect: Dialect) -> None:
        self.fairy = fairy
        self.dialect = dialect

    async def invalidate(self, exc: BaseException | None) -> None:
        """Close it and keep it out of the pool (as `AsyncConnection.invalidate`)."""
        await greenlet_spawn(self.fairy.invalidate, exc if isinstance(exc, Exception) else None)


DirectConnection = AsyncConnection | Pooled
"""What `Direct` statements run on: any connection, or one checked out by `connect`."""


@asynccontextmanager
async def connect(engine: AsyncEngine) -> AsyncIterator[DirectConnection]:
    """A connection of `engine` for `Direct` statements only.

    On PostgreSQL with an autocommit engine (`app.db.engine.autocommit`) the pool's
    connection itself: the checkout and the idle ping happen as for `engine.connect()`,
    and returning it resets nothing, since no transaction was begun on it. Otherwise
    `engine.connect()`.
    """
    if engine.dialect.name != "postgresql" or not _autocommit(engine.get_execution_options()):
        async with engine.connect() as conn:
            yield conn
        return
    fairy = await engine.raw_connection()
    try:
        yield Pooled(fairy, engine.dialect)
    finally:
        await greenlet_spawn(fairy.close)


@dataclass(frozen=True)
class BindPlan:
    """A statement compiled once for a dialect: its SQL, its parameters' positional order,
    their defaults and their type processors (`app.db.lite` runs the same on SQLite)."""

    sql: str
    names: tuple[str, ...]
    defaults: Mapping[str, Any]
    processors: tuple[Callable[[Any], Any] | None, ...]

    @classmethod
    def of(cls, compiled: Any, dialect: Dialect) -> BindPlan:
        names = tuple(compiled.positiontup or ())
        processors = tuple(
            compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names
        )
        return cls(compiled.string, names, dict(compiled.params), processors)

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        """The driver's positional arguments for `params` (a default where one is missing)."""
        args = []
        for name, process in zip(self.names, self.processors, strict=True):
            value = params[name] if name in params else self.defaults[name]
            args.append(process(value) if process is not None else value)
        return args


class Direct:
    """A Core statement compiled once for asyncpg; `rows()` runs it (see the module)."""

    def __init__(
        self, statement: Executable | None = None, *, build: Callable[[], Executable] | None = None
    ) -> None:
        """`statement`, or `build`: a function that makes it when it first runs (the grouped
        statements of `pg_start_group` and `pg_finish_group`, N renamed copies of a large
        statement, took half a second of every process's start to build, used or not)."""
        if (statement is None) == (build is None):
            raise TypeError("Direct takes a statement or a function that builds one")
        self._statement = statement
        self._build = build
        self._plan: BindPlan | None = None

    @property
    def statement(self) -> Executable:
        if self._statement is None:
            assert self._build is not None
            self._statement = self._build()
        return self._statement

    def _plan_for(self, dialect: Dialect) -> BindPlan:
        if self._plan is None:
            compiled = cast(ClauseElement, self.statement).compile(dialect=dialect)
            self._plan = BindPlan.of(compiled, dialect)
        return self._plan

    async def rows(self, conn: DirectConnection, params: Mapping[str, Any]) -> Sequence[Any]:
        """The result rows (indexable by column name and position)."""
        if isinstance(conn, Pooled):
            fairy = conn.fairy
        elif (
            conn.dialect.name != "postgresql"
            or conn.sync_connection is None
            or not _autocommit(conn.sync_connection.get_execution_options())
        ):
            result = await conn.execute(self.statement, dict(params))
            return result.mappings().all() if result.returns_rows else []
        else:
            fairy = await conn.get_raw_connection()
        plan = self._plan_for(conn.dialect)
        args = plan.args(params)
        driver = fairy.driver_connection
        assert driver is not None
        try:
            return await driver.fetch(plan.sql, *args)
        except BaseException as exc:
            # These statements fail for nothing but a broken or terminated connection, a
            # cancellation mid-statement or a server shutting down: never back to the pool.
            await conn.invalidate(exc if isinstance(exc, Exception) else None)
            raise

    async def one(self, conn: DirectConnection, params: Mapping[str, Any]) -> Any:
        rows = await self.rows(conn, params)
        if len(rows) != 1:
            raise RuntimeError(f"expected one row, got {len(rows)}")
        return rows[0]

    async def first(self, conn: DirectConnection, params: Mapping[str, Any]) -> Any | None:
        rows = await self.rows(conn, params)
        return rows[0] if rows else None


def _autocommit(options: Mapping[str, Any]) -> bool:
    """Whether an engine's or connection's execution options make it autocommit."""
    return options.get("isolation_level") == "AUTOCOMMIT"


def rows_as_json(rows: Any, name: str, *order: Any) -> Any:
    """The subquery `rows` (named `name`) as one JSON array of objects, in `order`."""
    aggregate = func.json_agg(aggregate_order_by(literal_column(name), *order), type_=JSON)
    return (
        select(func.coalesce(aggregate, literal_column("'[]'::json", JSON)))
        .select_from(rows)
        .correlate(None)
        .scalar_subquery()
    )
