"""PostgreSQL: the lease take and a turn's end read the key's next rows (`app.pipeline.prefetch`)."""

from __future__ import annotations

import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox
from app.events import InboundEvent
from app.pipeline import prefetch
from app.pipeline.inbox import _NEXT_ROWS, Inbox, InboxRow
from app.sessions import lease as leases
from tests.conftest import ServeApp
from tests.pipeline.test_fused import ANSWERED, KEY, _start, _with_session, finish
from tests.support.pg_probe import asyncpg_dsn, statements, while_another_worker_finishes


async def _take(engine: AsyncEngine, owner: str) -> tuple[int, list[InboxRow] | None] | None:
    lease, rows = await prefetch.acquire(engine, KEY, owner, 30)
    return None if lease is None else (lease.fence, rows)


async def _accept(inbox_: Inbox, *texts: str) -> list[str]:
    results = await inbox_.accept([InboundEvent.from_text("webhook", "c", "u", t) for t in texts])
    return [r.event_id for r in results]


async def test_taking_a_free_lease_reads_the_next_rows(pg_engine: AsyncEngine) -> None:
    inbox_ = Inbox(pg_engine)
    first, second, _ = await _accept(inbox_, "one", "two", "three")
    taken = await _take(pg_engine, "me")  # a new key: the statement creates its row
    assert taken is not None
    fence, rows = taken
    assert fence == 1 and rows is not None
    assert [r.event_id for r in rows] == [first, second]
    assert rows == await inbox_.next_rows(KEY, limit=prefetch.LIMIT)
    assert await _take(pg_engine, "another") is None  # held: nothing taken, nothing read
    assert await leases.release(pg_engine, leases.SessionLease(KEY, "me", fence))
    taken = await _take(pg_engine, "another")  # free again, the key's row exists
    assert taken is not None and taken[0] == 2 and taken[1] == rows


async def test_rows_a_worker_finished_while_the_take_waited_for_its_release_are_not_read(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    """The take reads the rows as they were when it began; here they changed before it took.

    Another worker holds the key's row locked: it takes the lease, finishes the pending
    event and releases, in a transaction that commits while the take waits for the lock.
    The take then gets the free lease, two fences on, and must not offer the finished
    event as unfinished: it leaves the rows to a separate read.
    """
    inbox_ = Inbox(pg_engine)
    [event_id] = await _accept(inbox_, "hello")
    lease = await leases.acquire(pg_engine, KEY, "old", ttl=30)
    assert lease is not None and await leases.release(pg_engine, lease)

    [row] = await inbox_.next_rows(KEY, limit=1)
    assert row.event_id == event_id
    taken = await while_another_worker_finishes(
        asyncpg_dsn(pg_url), KEY, row.id, lambda: _take(pg_engine, "me")
    )
    assert taken is not None
    fence, rows = taken
    assert fence == lease.fence + 2
    assert rows is None  # not the stale [hello]
    assert await inbox_.next_rows(KEY, limit=2) == []


async def test_a_turns_end_reads_the_rows_after_the_ones_it_finishes(pg_engine: AsyncEngine) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    inbox_ = Inbox(pg_engine)
    second, third = await _accept(inbox_, "two", "three")
    started = await _start(pg_engine, lease, row_id)
    assert started is not None
    finished = await finish(pg_engine, lease, started, row_id, "hi")
    assert finished.seq == started.seq + 1
    assert [r.event_id for r in finished.upcoming] == [second, third]
    assert finished.upcoming == await inbox_.next_rows(KEY, limit=prefetch.LIMIT)
    async with pg_engine.begin() as conn:  # a row being retried counts as unfinished too
        await conn.execute(update(inbox).where(inbox.c.event_id == second).values(status="processing"))
    assert [r.event_id for r in await inbox_.next_rows(KEY, limit=2)] == [second, third]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_queued_turns_of_a_key_never_read_their_rows_separately(serve: ServeApp) -> None:
    async with serve() as srv:
        with statements(srv.runtime.engine) as seen:
            accepted = await srv.runtime.inbox.accept(
                [InboundEvent.from_text("webhook", "c", "u", f"hello {i}") for i in range(3)]
            )
            for one in accepted:
                assert (await srv.runtime.inbox.wait_for_replies(one.event_id, 10)).done
        next_rows = _NEXT_ROWS._plan_for(srv.runtime.engine.dialect).sql
        assert sum(s.startswith("WITH fence AS MATERIALIZED") for s in seen) == 3  # three turns
        assert next_rows not in seen
