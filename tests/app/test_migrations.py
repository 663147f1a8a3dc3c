"""The migration history builds exactly the schema the models describe, on both backends."""

from __future__ import annotations

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
