"""Alembic environment: async engines, batch mode on SQLite."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db.lite import BUSY_TIMEOUT, WAL
from app.db.models import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Replicas starting together: the first migrates, the others wait, then find head.
            connection.execute(text("SELECT pg_advisory_xact_lock(7244051)"))
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(
        config.get_main_option("sqlalchemy.url") or "",
        poolclass=NullPool,
        connect_args=config.attributes.get("connect_args", {}),  # app.migrate.alembic_config
    )
    async with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # WAL from the start, set by this one connection: the app's connections each ask
            # for it too (app.db.lite.PRAGMAS), and on a file still in rollback mode the
            # first few of them, opening together, race to convert it; the losers get
            # "database is locked" at once, before any busy timeout applies.
            await connection.exec_driver_sql(BUSY_TIMEOUT)
            await connection.exec_driver_sql(WAL)
            await connection.commit()  # SQLAlchemy began a transaction; the migrations begin their own
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
