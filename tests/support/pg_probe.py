"""Watching and racing the statements a test's code sends to PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")


def asyncpg_dsn(url: str) -> str:
    """A SQLAlchemy `postgresql+asyncpg://` URL as asyncpg's own DSN."""
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def wait_until_blocked(conn: asyncpg.Connection, query_prefix: str) -> None:
    """Until a statement starting with `query_prefix` waits for a lock in this database."""
    for _ in range(200):
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE $1",
            query_prefix + "%",
        )
        if waiting:
            break
        await asyncio.sleep(0.02)
    assert waiting == 1


async def while_locked(
    dsn: str,
    steps: Sequence[tuple[str, Sequence[Any]]],
    statement: Callable[[], Coroutine[Any, Any, T]],
    query_prefix: str = "WITH",
) -> T:
    """Run `statement` while another transaction holds the locks its `steps` (SQL and
    arguments) took, and commit that transaction once `statement` waits for them.

    The wait is watched from a third connection: within a transaction PostgreSQL keeps
    showing the activity it first read.
    """
    other, watcher = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        tx = other.transaction()
        await tx.start()
        for sql, args in steps:
            await other.execute(sql, *args)
        running: asyncio.Task[T] = asyncio.create_task(statement())
        await wait_until_blocked(watcher, query_prefix)
        await tx.commit()
        return await running
    finally:
        await other.close()
        await watcher.close()


async def while_another_worker_finishes(
    dsn: str,
    key: str,
    inbox_id: int,
    statement: Callable[[], Coroutine[Any, Any, T]],
    query_prefix: str = "WITH",
) -> T:
    """Run `statement` while another worker takes `key`'s lease, finishes its inbox row
    `inbox_id` and releases, in a transaction that commits while `statement` waits for the
    key's row lock. The statement then sees the lease free, two fences on, but read the
    inbox as it was before: the interleaving the rows-read-with-a-take rule guards against.
    """
    steps: list[tuple[str, Sequence[Any]]] = [
        (
            "UPDATE session_keys SET lease_owner = 'other', lease_fence = lease_fence + 1 WHERE key = $1",
            [key],
        ),
        ("UPDATE inbox SET status = 'done' WHERE id = $1", [inbox_id]),
        ("UPDATE session_keys SET lease_owner = NULL WHERE key = $1", [key]),
    ]
    return await while_locked(dsn, steps, statement, query_prefix)


@contextlib.contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement `engine`'s pool sends to PostgreSQL meanwhile (asyncpg's query logger)."""
    seen: list[str] = []
    logged: set[Any] = set()

    def log(query: Any) -> None:
        seen.append(query.query)

    def checkout(dbapi_conn: Any, *_rest: Any) -> None:
        if dbapi_conn.driver_connection not in logged:  # once per connection, not per checkout
            logged.add(dbapi_conn.driver_connection)
            dbapi_conn.driver_connection.add_query_logger(log)

    pool = engine.sync_engine.pool
    event.listen(pool, "checkout", checkout)
    try:
        yield seen
    finally:
        event.remove(pool, "checkout", checkout)
        for conn in logged:
            conn.remove_query_logger(log)
