"""The pipeline's storage port and its implementations (see `port`)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.pipeline.storage.port import PipelineStore
from app.pipeline.storage.portable import PortableStore
from app.sessions.store import SessionStore


def build_store(
    engine: AsyncEngine, sessions: SessionStore, *, lease_ttl: float, kind: str = "auto"
) -> PipelineStore:
    """The store for `engine`, chosen once: unless `kind` is "portable", `PostgresStore` on
    PostgreSQL and `SqliteStore` on a SQLite file; else `PortableStore`."""
    if kind == "auto" and engine.dialect.name == "postgresql":
        from app.pipeline.storage.postgres import PostgresStore  # asyncpg's statements only there

        return PostgresStore(engine, sessions, lease_ttl=lease_ttl)
    if kind == "auto" and engine.dialect.name == "sqlite":
        from app.pipeline.storage.sqlite import SqliteStore, database_file

        path = database_file(engine)
        if path is not None:
            return SqliteStore(engine, sessions, lease_ttl=lease_ttl, path=path)
    return PortableStore(engine, sessions, lease_ttl=lease_ttl)
