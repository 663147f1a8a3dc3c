"""A task cancelled while it opens a connection gives the connection back to the pool.

On SQLite the autocommit view sets the isolation level on every checkout, a round trip
to aiosqlite's thread inside SQLAlchemy's `Connection.__init__`. A cancellation landing
there used to leave the pooled connection checked out and referenced by nothing: the
garbage collector later warned "cleaning up non-checked-in connection" (SAWarning),
which is what tests/app/agent/test_history_legality.py logged. Cancelling at every
point of the start must leave nothing checked out and nothing for the collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import SAWarning
from sqlalchemy.pool import QueuePool

from app.db.engine import autocommit, create_engine
from tests.conftest import make_settings

pytestmark = pytest.mark.filterwarnings(
    "error::sqlalchemy.exc.SAWarning", "error::pytest.PytestUnraisableExceptionWarning"
)


async def test_a_cancel_at_any_point_of_connecting_leaves_nothing_checked_out(tmp_path: Path) -> None:
    engine = create_engine(make_settings(f"sqlite+aiosqlite:///{tmp_path / 'cancel.db'}"))
    single = autocommit(engine)
    pool = engine.sync_engine.pool
    assert isinstance(pool, QueuePool)
    try:
        async with single.connect() as conn:  # the pool now holds an open connection
            await conn.execute(text("select 1"))
        cut = 0
        for steps in range(12):  # cut after 0, 1, 2, … passes of the event loop

            async def use() -> None:
                async with single.connect() as conn:
                    await conn.execute(text("select 1"))

            task = asyncio.create_task(use())
            for _ in range(steps):
                await asyncio.sleep(0)
            cut += task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert pool.checkedout() == 0, f"cut after {steps} steps"
        assert cut > 0  # some of the cuts landed while the connection was being opened
        with warnings.catch_warnings():
            warnings.simplefilter("error", SAWarning)
            gc.collect()
        async with single.connect() as conn:  # and the pool still serves
            assert (await conn.execute(text("select 1"))).scalar() == 1
    finally:
        await engine.dispose()
