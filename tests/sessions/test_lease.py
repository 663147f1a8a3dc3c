"""Fenced leases: one holder per key; a worker whose lease was taken over cannot write."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import messages, utcnow
from app.errors import LeaseLost
from app.sessions import lease as leases
from app.sessions.messages import ChatMessage
from app.sessions.store import Lifecycle, SessionStore


async def test_a_held_lease_is_not_given_to_another_owner(engine: AsyncEngine) -> None:
    a = await leases.acquire(engine, "k", "worker-a", ttl=30)  # a new key: its row is created
    assert a is not None and a.fence == 1
    assert await leases.acquire(engine, "k", "worker-b", ttl=30) is None
    again = await leases.acquire(engine, "k", "worker-a", ttl=30)  # ours already: a new fence
    assert again is not None and again.fence == 2
    a = again
    await leases.release(engine, a)
    b = await leases.acquire(engine, "k", "worker-b", ttl=30)
    assert b is not None and b.fence == a.fence + 1


async def test_worker_whose_lease_was_taken_over_cannot_append(engine: AsyncEngine) -> None:
    store = SessionStore(engine, Lifecycle())
    a = await leases.acquire(engine, "k", "worker-a", ttl=30)
    assert a is not None
    async with engine.begin() as conn:
        await leases.check_fence(conn, a)
        session = await store.open_current(conn, "k", "test")
        await store.append(conn, session.id, [ChatMessage(role="user", content="from a")])

    # Worker A stalls past its lease; B takes the key over (its clock is past A's expiry).
    b = await leases.acquire(engine, "k", "worker-b", ttl=30, now=utcnow() + timedelta(seconds=31))
    assert b is not None and b.fence > a.fence

    with pytest.raises(LeaseLost):
        async with engine.begin() as conn:
            await leases.check_fence(conn, a)
            await store.append(conn, session.id, [ChatMessage(role="user", content="late write by a")])
    assert not await leases.renew(engine, a, ttl=30)

    async with engine.begin() as conn:
        await leases.check_fence(conn, b)
        await store.append(conn, session.id, [ChatMessage(role="user", content="from b")])
    history = [m.content for m in await store.all_messages(session.id)]
    assert history == ["from a", "from b"]
    async with engine.connect() as conn:
        count = (await conn.execute(select(func.count()).select_from(messages))).scalar_one()
    assert count == 2
    # A releasing its stale lease does not free B's.
    await leases.release(engine, a)
    assert await leases.acquire(engine, "k", "worker-c", ttl=30) is None


async def test_expired_lease_of_a_dead_worker_is_taken(engine: AsyncEngine) -> None:
    dead = await leases.acquire(engine, "k", "dead", ttl=0.01)
    assert dead is not None
    assert await leases.acquire(engine, "k", "alive", ttl=30, now=utcnow() + timedelta(seconds=1))
