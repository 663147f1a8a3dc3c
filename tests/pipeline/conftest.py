"""The pipeline's tests run on every store: SQLite, and PostgreSQL with each implementation.

`backend` is "sqlite" (`SqliteStore`, one hop per transaction, and the portable code
where it falls back), "postgres" (`PostgresStore`, single statements) or
"postgres-portable" (the portable store on PostgreSQL). `db_url`, `engine`
and `serve` follow it, so every test here that uses them runs three times; `store` is the
pipeline store alone on a migrated database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.channel import ChannelSettings
from app.db.engine import create_engine
from app.migrate import upgrade
from app.pipeline.storage import build_store
from app.pipeline.storage.port import PipelineStore
from app.pipeline.storage.postgres import PostgresStore
from app.sessions.store import Lifecycle, SessionStore
from tests.conftest import ServeApp, make_settings, webhook_settings
from tests.support.db import database
from tests.support.servers import RunningApp, serve_in_loop

BACKENDS = ["sqlite", "postgres", "postgres-portable"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def store_kind(backend: str) -> str:
    return "portable" if backend == "postgres-portable" else "auto"


@pytest.fixture
async def db_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    async with database("sqlite" if backend == "sqlite" else "postgres", tmp_path) as url:
        yield url


@pytest.fixture
async def store(db_url: str, backend: str) -> AsyncIterator[PipelineStore]:
    await upgrade(db_url)
    engine = create_engine(make_settings(db_url))
    built = build_store(engine, SessionStore(engine, Lifecycle()), lease_ttl=30.0, kind=store_kind(backend))
    try:
        yield built
    finally:
        await built.close()
        await engine.dispose()


@pytest.fixture
def pg_store(pg_engine: AsyncEngine) -> PostgresStore:
    """`PostgresStore` alone, for the tests of what only it does (its grouped statements)."""
    return PostgresStore(pg_engine, SessionStore(pg_engine, Lifecycle()), lease_ttl=30)


def engine_of(store: PipelineStore) -> AsyncEngine:
    return store.sessions.engine


@pytest.fixture
def serve(db_url: str, backend: str) -> ServeApp:
    """`async with serve(**settings) as running:` the app on a real port, on `backend`."""

    def _serve(
        *,
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        provider: Any = None,
        tools: Any = None,
        wrap_store: Any = None,
        **overrides: Any,
    ) -> AbstractAsyncContextManager[RunningApp]:
        overrides.setdefault("pipeline_store", store_kind(backend))
        settings = make_settings(db_url, **overrides)
        app = create_app(
            settings,
            channel_settings=channel_settings
            if channel_settings is not None
            else {"webhook": webhook_settings()},
            provider=provider,
            tools=tools,
            wrap_store=wrap_store,
        )
        return serve_in_loop(app)

    return _serve
