"""Engine creation for PostgreSQL (asyncpg) and SQLite (aiosqlite)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.config import Settings


def create_engine(settings: Settings) -> AsyncEngine:
    url = settings.database_url
    if url.startswith("sqlite"):
        # One writer at a time is SQLite's nature; WAL lets readers run beside it and
        # busy_timeout makes writers queue instead of failing with "database is locked".
        engine = create_async_engine(url)

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_async_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_pool_size,
        pool_pre_ping=True,
    )


def autocommit_reader(engine: AsyncEngine) -> AsyncEngine:
    """The same pool for single reads, without the BEGIN/ROLLBACK round trips around them."""
    return engine.execution_options(isolation_level="AUTOCOMMIT")
