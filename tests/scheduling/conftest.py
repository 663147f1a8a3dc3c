"""A migrated database with a job store on it, on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from app.db.engine import create_engine
from app.migrate import upgrade
from app.scheduling import JobStore
from tests.conftest import make_settings


@pytest.fixture
async def jobs(db_url: str) -> AsyncIterator[JobStore]:
    settings = make_settings(db_url)
    await upgrade(settings.database_url)
    engine = create_engine(settings)
    try:
        yield JobStore(engine)
    finally:
        await engine.dispose()
