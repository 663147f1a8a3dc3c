"""PostgreSQL: lease changes and redone-on-retry writes commit without waiting for the disk.

Counted with `pg_stat_wal.wal_sync` (the WAL flushes of the whole cluster): a durable
fenced write flushes once per commit, a lax one leaves the flushing to the WAL writer.
"""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import session_keys
from app.sessions import lease as leases

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


async def _fenced_writes(engine: AsyncEngine, lease: leases.SessionLease, *, lax: bool) -> None:
    for _ in range(COMMITS):
        async with engine.begin() as conn:
            await leases.check_fence(conn, lease, lax=lax)
            await conn.execute(
                session_keys.update().where(session_keys.c.key == lease.key).values(current_session_id=None)
            )


async def test_lax_writes_leave_flushing_to_the_wal_writer_and_durable_ones_flush(
    pg_engine: AsyncEngine,
) -> None:
    lease = await leases.acquire(pg_engine, "webhook:lax", "me", 30)
    assert lease is not None
    before = await _wal_syncs(pg_engine)
    await _fenced_writes(pg_engine, lease, lax=False)
    durable = await _wal_syncs(pg_engine) - before

    before = await _wal_syncs(pg_engine)
    await _fenced_writes(pg_engine, lease, lax=True)
    for i in range(COMMITS // 2):  # taking and giving up leases: two commits each
        taken = await leases.acquire(pg_engine, f"webhook:lax-{i}", "me", 30)
        assert taken is not None
        assert await leases.release(pg_engine, taken) is False
    lax = await _wal_syncs(pg_engine) - before

    assert durable >= COMMITS * 0.8, durable
    assert lax < COMMITS / 4, (lax, durable)
