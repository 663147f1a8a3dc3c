"""PostgreSQL: lease changes and redone-on-retry writes commit without waiting for the disk.

Counted with `pg_stat_wal.wal_sync` (the WAL flushes of the whole cluster): a durable
fenced write flushes once per commit, a lax one leaves the flushing to the WAL writer.
Measured on a cluster of the test's own, so no other work on the shared server is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import create_engine
from app.migrate import upgrade
from app.sessions import lease as leases
from app.sessions.messages import ChatMessage, tool_call
from app.sessions.store import Lifecycle, SessionStore
from tests.support.own_cluster import own_cluster
from tests.support.pipeline import store_for

# serial: a cluster of its own (initdb, start) is heavy on a loaded machine, and the flush
# counts are a timing measurement.
pytestmark = [pytest.mark.serial, pytest.mark.alone]

COMMITS = 100


async def _wal_syncs(engine: AsyncEngine) -> int:
    # Backends report their statistics when they exit: close the pool's connections first.
    await engine.dispose()
    await asyncio.sleep(0.5)
    url = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT wal_sync FROM pg_stat_wal"))
    finally:
        await conn.close()


async def _fenced_writes(
    engine: AsyncEngine, lease: leases.SessionLease, session_id: int, *, lax: bool
) -> None:
    """Messages appended during a run: tool calls (lax: redone if lost) or tool results (durable)."""
    store = store_for(engine)
    for i in range(COMMITS):
        if lax:
            message = ChatMessage(
                role="assistant", content=None, tool_calls=(tool_call(f"c{i}", "echo", {}),)
            )
        else:
            message = ChatMessage(role="tool", content="done", tool_call_id=f"c{i}", name="echo")
        await store.append(lease, session_id, [message], run_id=None)


@pytest.fixture
async def pg_engine() -> AsyncIterator[AsyncEngine]:
    """A migrated engine on a cluster no other program uses (pg_stat_wal is cluster-wide)."""
    with own_cluster() as url:
        await upgrade(url)
        eng = create_engine(Settings(_env_file=None, database_url=url))  # type: ignore[call-arg]
        try:
            yield eng
        finally:
            await eng.dispose()


async def test_lax_writes_leave_flushing_to_the_wal_writer_and_durable_ones_flush(
    pg_engine: AsyncEngine,
) -> None:
    lease = await leases.acquire(pg_engine, "webhook:lax", "me", 30)
    assert lease is not None
    async with pg_engine.begin() as conn:
        await leases.check_fence(conn, lease)
        session = await SessionStore(pg_engine, Lifecycle()).open_current(conn, lease.key, "webhook")
    before = await _wal_syncs(pg_engine)
    await _fenced_writes(pg_engine, lease, session.id, lax=False)
    durable = await _wal_syncs(pg_engine) - before

    before = await _wal_syncs(pg_engine)
    await _fenced_writes(pg_engine, lease, session.id, lax=True)
    for i in range(COMMITS // 2):  # taking and giving up leases: two commits each
        taken = await leases.acquire(pg_engine, f"webhook:lax-{i}", "me", 30)
        assert taken is not None
        assert await leases.release(pg_engine, taken) is False
    lax = await _wal_syncs(pg_engine) - before

    assert durable >= COMMITS * 0.8, durable
    assert lax < COMMITS / 4, (lax, durable)
