"""Fenced per-key leases in the database: one worker per session key, across processes.

Taking a lease increments the key's fence. Every write a worker makes for the key runs
`check_fence` first, in the same transaction: an `UPDATE … WHERE owner = me AND fence =
mine` that also row-locks the key on PostgreSQL, so a takeover either happened before
(and the write fails with `LeaseLost`) or waits until the write committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.models import session_keys, utcnow
from app.db.upsert import insert_ignore
from app.errors import LeaseLost


@dataclass(frozen=True)
class SessionLease:
    key: str
    owner: str
    fence: int
    took_over: bool = False  # taken from another owner whose lease had expired


async def ensure_key(conn: AsyncConnection, key: str) -> None:
    await conn.execute(insert_ignore(conn, session_keys, ["key"]).values(key=key, lease_fence=0))


async def acquire(
    engine: AsyncEngine, key: str, owner: str, ttl: float, *, now: datetime | None = None
) -> SessionLease | None:
    """Take the key's lease if it is free, expired or already ours; None if held.

    The common case (the key exists and is free) is one statement; creating the key's
    row and taking an expired lease over (`took_over`) are the slower paths.
    """
    now = now or utcnow()
    free = or_(session_keys.c.lease_owner.is_(None), session_keys.c.lease_owner == owner)
    expired = and_(session_keys.c.lease_owner != owner, session_keys.c.lease_expires_at < now)
    async with engine.begin() as conn:
        fence = await _take(conn, key, owner, ttl, now, free)
        if fence is None:
            await ensure_key(conn, key)
            fence = await _take(conn, key, owner, ttl, now, free)
        if fence is not None:
            return SessionLease(key, owner, fence)
        fence = await _take(conn, key, owner, ttl, now, expired)
    return SessionLease(key, owner, fence, took_over=True) if fence is not None else None


async def _take(
    conn: AsyncConnection, key: str, owner: str, ttl: float, now: datetime, condition: Any
) -> int | None:
    return (
        await conn.execute(
            update(session_keys)
            .where(session_keys.c.key == key, condition)
            .values(
                lease_owner=owner,
                lease_fence=session_keys.c.lease_fence + 1,
                lease_expires_at=now + timedelta(seconds=ttl),
            )
            .returning(session_keys.c.lease_fence)
        )
    ).scalar()


async def renew(engine: AsyncEngine, lease: SessionLease, ttl: float) -> bool:
    async with engine.begin() as conn:
        result = await conn.execute(
            update(session_keys)
            .where(
                session_keys.c.key == lease.key,
                session_keys.c.lease_owner == lease.owner,
                session_keys.c.lease_fence == lease.fence,
            )
            .values(lease_expires_at=utcnow() + timedelta(seconds=ttl))
        )
    return result.rowcount == 1


async def release(engine: AsyncEngine, lease: SessionLease) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            update(session_keys)
            .where(
                session_keys.c.key == lease.key,
                session_keys.c.lease_owner == lease.owner,
                session_keys.c.lease_fence == lease.fence,
            )
            .values(lease_owner=None, lease_expires_at=None)
        )


async def check_fence(conn: AsyncConnection, lease: SessionLease) -> None:
    """Raise `LeaseLost` unless `lease` is still the key's current lease (same tx as the write)."""
    result = await conn.execute(
        update(session_keys)
        .where(
            session_keys.c.key == lease.key,
            session_keys.c.lease_owner == lease.owner,
            session_keys.c.lease_fence == lease.fence,
        )
        .values(lease_fence=session_keys.c.lease_fence)
    )
    if result.rowcount != 1:
        raise LeaseLost(lease.key, lease.fence)
