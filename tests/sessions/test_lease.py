"""Fenced leases: one holder per key; a worker whose lease was taken over cannot write."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import messages, sessions, utcnow
from app.errors import LeaseLost
from app.sessions import lease as leases
from app.sessions.messages import ChatMessage, tool_call
from app.sessions.store import Lifecycle, SessionStore


async def test_a_held_lease_is_not_given_to_another_owner(engine: AsyncEngine) -> None:
    a = await leases.acquire(engine, "k", "worker-a", ttl=30)
    assert a is not None
    assert await leases.acquire(engine, "k", "worker-b", ttl=30) is None
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


async def test_an_append_that_checks_the_fence_itself_refuses_a_stale_lease(engine: AsyncEngine) -> None:
    """`append(..., lease=)` (one statement on PostgreSQL): the same fencing as `check_fence`."""
    store = SessionStore(engine, Lifecycle())
    a = await leases.acquire(engine, "k", "worker-a", ttl=30)
    assert a is not None
    call = tool_call("c1", "current_time", {})
    written = [
        ChatMessage(role="user", content="hi", event_id="e1"),
        ChatMessage(role="assistant", content=None, tool_calls=(call,)),
        ChatMessage(role="tool", content="12:00", tool_call_id="c1", name="current_time"),
        ChatMessage(role="assistant", content="noon", parts=({"type": "text", "text": "noon"},)),
    ]
    async with engine.begin() as conn:
        session = await store.open_current(conn, "k", "test")
        assert await store.append(conn, session.id, written[:1], lease=a) == [1]
    async with engine.begin() as conn:
        assert await store.append(conn, session.id, written[1:], run_id=7, lease=a) == [2, 3, 4]
    async with engine.begin() as conn:
        assert await store.append(conn, session.id, [], lease=a) == []  # still checks: held

    b = await leases.acquire(engine, "k", "worker-b", ttl=30, now=utcnow() + timedelta(seconds=31))
    assert b is not None
    for late in ([ChatMessage(role="user", content="late")], []):
        with pytest.raises(LeaseLost):
            async with engine.begin() as conn:
                await store.append(conn, session.id, late, lease=a)

    stored = await store.all_messages(session.id)
    assert [(m.seq, m.role, m.content) for m in stored] == [
        (1, "user", "hi"),
        (2, "assistant", None),
        (3, "tool", "12:00"),
        (4, "assistant", "noon"),
    ]
    assert stored[0].event_id == "e1"
    assert stored[1].tool_calls == (call,)
    assert stored[2].tool_call_id == "c1" and stored[2].name == "current_time"
    assert stored[3].parts == ({"type": "text", "text": "noon"},)
    async with engine.connect() as conn:
        rows = (await conn.execute(select(messages.c.seq, messages.c.run_id).order_by(messages.c.seq))).all()
        next_seq = (await conn.execute(select(sessions.c.next_seq))).scalar_one()
    assert [r.run_id for r in rows] == [None, 7, 7, 7]
    assert next_seq == 5  # the refused append did not bump the sequence
    async with engine.begin() as conn:  # JSON null stored like the other path stores it
        assert (await store.open_current(conn, "k", "test")).tail_open is False
