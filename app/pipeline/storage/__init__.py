"""The pipeline's storage port and its implementations (see `port`)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.pipeline.storage.port import PipelineStore
from app.pipeline.storage.portable import PortableStore
from app.sessions.store import SessionStore


def build_store(
    engine: AsyncEngine, sessions: SessionStore, *, lease_ttl: float, kind: str = "auto"
) -> PipelineStore:
    """The store for `engine`, chosen once: `PostgresStore` on PostgreSQL unless `kind` is
    "portable", else `PortableStore`."""
    if kind == "auto" and engine.dialect.name == "postgresql":
        from app.pipeline.storage.postgres import PostgresStore  # asyncpg's statements only there

        return PostgresStore(engine, sessions, lease_ttl=lease_ttl)
    return PortableStore(engine, sessions, lease_ttl=lease_ttl)
