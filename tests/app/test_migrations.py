"""The migration history builds exactly the schema the models describe, on both backends."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app.db.engine import create_engine
from app.db.models import metadata
from app.migrate import upgrade
from tests.conftest import make_settings


def _differences(sync_conn: Any) -> list[Any]:
    context = MigrationContext.configure(sync_conn, opts={"compare_type": False})
    return list(compare_metadata(context, metadata))


async def test_migrations_at_head_match_the_models(db_url: str) -> None:
    await upgrade(db_url)
    engine = create_engine(make_settings(db_url))
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(_differences)
    finally:
        await engine.dispose()
    # Alembic's own bookkeeping table is not part of the models.
    diff = [d for d in diff if not (d[0] == "remove_table" and d[1].name == "alembic_version")]
    assert diff == []


async def test_a_migrated_sqlite_file_is_in_wal_mode_before_the_app_opens_it(tmp_path: Path) -> None:
    """The app's connections all ask for WAL as they open; on a file still in rollback mode
    the ones opening together raced to convert it and the losers failed at once with
    "database is locked". The migration leaves the file in WAL, so nothing is converted then."""
    path = tmp_path / "new.db"
    await upgrade(f"sqlite+aiosqlite:///{path}")
    assert _file_format(path) == (2, 2), "not WAL"  # bytes 18-19 of the header: 2 = WAL
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def _file_format(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:20]
    return header[18], header[19]
