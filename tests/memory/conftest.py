"""A migrated database engine on both backends, for tests below the HTTP app."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.migrate import upgrade
from tests.conftest import make_settings


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    await upgrade(db_url)
    eng = create_engine(make_settings(db_url))
    yield eng
    await eng.dispose()
