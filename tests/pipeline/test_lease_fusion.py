"""PostgreSQL: the lease is taken by the statement accepting an event and given up by the
statement ending its turn.

Accepting an event takes its key's free lease in the same statement, and the dispatcher
starts the key's turn without a statement of its own to take it (`prefetch.ACCEPT_TAKING`,
`Inbox.claimer`). The turn's end releases the lease when the key has nothing left to do
and no after-turn work is due (`fused.finish(release=True)`).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import direct
from app.db.engine import autocommit
from app.db.models import inbox, session_keys, utcnow
from app.errors import LeaseLost
from app.events import InboundEvent
from app.pipeline import fused, prefetch
from app.pipeline.accept_start import ACCEPT_STARTING
from app.pipeline.inbox import Inbox
from app.sessions import lease as leases
from tests.conftest import ServeApp
from tests.pipeline.test_fused import ANSWERED, _start, _with_session, finish
from tests.support.pg_probe import asyncpg_dsn, statements, wait_until_blocked, while_another_worker_finishes

KEY = "webhook:c"


async def _accept_taking(engine: AsyncEngine, text: str, owner: str, external_id: str | None = None) -> Any:
    """Run the statement as `Inbox.accept` does; returns its row (id, fence, upcoming)."""
    one = InboundEvent.from_text("webhook", "c", "u", text, external_id=external_id)
    now = utcnow()
    params = Inbox._values(one, now)
    params.update(k=one.session_key, o=owner, exp=now + timedelta(seconds=30))
    async with direct.connect(autocommit(engine)) as conn:  # as Inbox.accept: no BEGIN/COMMIT
        return dict(await prefetch.ACCEPT_TAKING[external_id is not None].one(conn, params))


async def lease_of(engine: AsyncEngine, key: str) -> tuple[str | None, int] | None:
    """The key's lease owner and fence; None when the key has no row."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(session_keys.c.lease_owner, session_keys.c.lease_fence).where(
                    session_keys.c.key == key
                )
            )
        ).first()
    return None if row is None else (row[0], row[1])


async def _lease(engine: AsyncEngine) -> tuple[str | None, int]:
    lease = await lease_of(engine, KEY)
    assert lease is not None
    return lease


async def _pending(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(inbox.c.event_id).where(inbox.c.status == "pending").order_by(inbox.c.id)
        )
    return [r[0] for r in rows]


async def test_the_statement_takes_a_free_lease_and_reads_the_rows_before_the_event(
    pg_engine: AsyncEngine,
) -> None:
    first = await _accept_taking(pg_engine, "one", "me")
    assert first["id"] is not None and first["fence"] == 1  # a new key: its row is created
    assert first["upcoming"] == []  # the statement does not see its own insert
    assert await _lease(pg_engine) == ("me", 1)

    held = await _accept_taking(pg_engine, "two", "other")  # held by "me": stored, not taken
    assert held["id"] is not None and held["fence"] is None and held["upcoming"] is None
    mine = await _accept_taking(pg_engine, "three", "me")  # ours already: not taken again
    assert mine["fence"] is None and await _lease(pg_engine) == ("me", 1)

    assert await leases.release(pg_engine, leases.SessionLease(KEY, "me", 1))
    free = await _accept_taking(pg_engine, "four", "other")
    assert free["fence"] == 2
    assert [r["payload"]["parts"][0]["text"] for r in free["upcoming"]] == ["one", "two"]  # LIMIT 2
    assert len(await _pending(pg_engine)) == 4


async def test_a_duplicate_is_not_stored_and_takes_no_lease(pg_engine: AsyncEngine) -> None:
    first = await _accept_taking(pg_engine, "one", "me", external_id="x-1")
    assert first["fence"] == 1
    assert await leases.release(pg_engine, leases.SessionLease(KEY, "me", 1))
    again = await _accept_taking(pg_engine, "one", "other", external_id="x-1")
    assert again == {"id": None, "fence": None, "upcoming": None}
    assert await _lease(pg_engine) == (None, 1)
    assert len(await _pending(pg_engine)) == 1


async def test_rows_a_worker_finished_while_the_statement_waited_for_its_release_are_not_read(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    """As `test_prefetch`'s take: the statement read the rows before it got the key's row lock.

    Another worker takes the lease, finishes the pending event and releases, committing
    while the accepting statement waits for the lock. The statement then takes the free
    lease two fences on, and must not hand over the finished event as unfinished.
    """
    row_id = (await _accept_taking(pg_engine, "hello", "old"))["id"]
    assert await leases.release(pg_engine, leases.SessionLease(KEY, "old", 1))
    taken = await while_another_worker_finishes(
        asyncpg_dsn(pg_url), KEY, row_id, lambda: _accept_taking(pg_engine, "next", "me")
    )
    assert taken["fence"] == 3
    assert taken["upcoming"] is None  # not the stale [hello]: the dispatcher reads the rows


async def _turns(srv: Any, *texts: str) -> None:
    """One turn per text, each after the previous one's worker ended."""
    for text in texts:
        [accepted] = await srv.runtime.inbox.accept([InboundEvent.from_text("webhook", "c", "u", text)])
        result = await srv.runtime.inbox.wait_for_replies(accepted.event_id, 10)
        assert result.done and result.replies[0].text
        for _ in range(500):
            if not srv.runtime.dispatcher.busy_keys:
                break
            await asyncio.sleep(0.02)
        assert not srv.runtime.dispatcher.busy_keys, "the key's worker did not end"


def _sql(srv: Any, statement: Any) -> str:
    return str(statement._plan_for(srv.runtime.engine.dialect).sql)


def accepts_taking(srv: Any, seen: list[str]) -> int:
    """How many of the `seen` statements accepted an event taking its key's lease (and maybe
    starting its turn, `accept_start`)."""
    variants = {_sql(srv, s) for s in (*prefetch.ACCEPT_TAKING.values(), *ACCEPT_STARTING.values())}
    return sum(sql in variants for sql in seen)


def starts(srv: Any, seen: list[str]) -> int:
    """How many of the `seen` statements were a worker's one-statement start (`fused.START`)."""
    variants = {_sql(srv, s) for s in fused.START.values()}
    return sum(sql in variants for sql in seen)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_an_idle_key_is_answered_without_statements_to_take_or_release_its_lease(
    serve: ServeApp,
) -> None:
    """The served path: the accept takes the lease (and starts the turn when the key's session
    can be continued), the turn runs on it, its end releases it."""
    async with serve() as srv:
        with statements(srv.runtime.engine) as seen:
            await _turns(srv, "one", "two")  # the second finds the lease released again
        assert accepts_taking(srv, seen) == 2
        # The first opened the session in a start of its own: a key this process has not
        # started a turn of gets no start planned with its accept. The second's accept
        # started its turn.
        assert starts(srv, seen) == 1
        variants = [sql for sql in seen if sql in {_sql(srv, s) for s in ACCEPT_STARTING.values()}]
        assert seen.index(_sql(srv, prefetch.ACCEPT_TAKING[False])) < seen.index(variants[0])
        assert len(variants) == 1
        assert _sql(srv, prefetch.TAKE) not in seen
        assert _sql(srv, leases._RELEASE["postgresql"]) not in seen
        assert await _lease(srv.runtime.engine) == (None, 2)  # one lease per turn, both taken on accept


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_due_after_turn_hook_keeps_the_lease_for_itself(serve: ServeApp) -> None:
    """Consolidation may be due after the turn: its end keeps the lease, the hook runs under it,
    and the worker releases the lease after the hook."""
    async with serve(consolidation_keep_messages=1, consolidation_threshold_messages=1000) as srv:
        with statements(srv.runtime.engine) as seen:
            await _turns(srv, "one")  # leaves 2 messages: more than keep_messages
        assert seen.count(_sql(srv, leases._RELEASE["postgresql"])) == 1
        assert await _lease(srv.runtime.engine) == (None, 1)


async def test_a_turns_end_releases_the_lease_only_when_asked_and_nothing_is_left(
    pg_engine: AsyncEngine,
) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    started = await _start(pg_engine, lease, row_id)
    kept = await finish(pg_engine, lease, started, row_id, "hi")  # not asked
    assert not kept.released and await _lease(pg_engine) == ("me", lease.fence)

    inbox_ = Inbox(pg_engine)
    await inbox_.accept([InboundEvent.from_text("webhook", "c", "u", "two")])
    [row] = await inbox_.next_rows(KEY, limit=1)
    started = await _start(pg_engine, lease, row.id)
    [later] = await inbox_.accept([InboundEvent.from_text("webhook", "c", "u", "three")])
    busy = await finish(pg_engine, lease, started, row.id, "hi", release=True)
    assert not busy.released  # "three" waits
    assert [r.event_id for r in busy.upcoming] == [later.event_id]
    assert await _lease(pg_engine) == ("me", lease.fence)

    [last] = await inbox_.next_rows(KEY, limit=1)
    started = await _start(pg_engine, lease, last.id)
    idle = await finish(pg_engine, lease, started, last.id, "hi", release=True)
    assert idle.released and idle.upcoming == []
    assert await _lease(pg_engine) == (None, lease.fence)  # free, at the same fence
    with pytest.raises(LeaseLost):  # and no longer ours to write under
        await _start(pg_engine, lease, last.id)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_an_accept_cancelled_mid_statement_still_hands_its_lease_to_a_worker(serve: ServeApp) -> None:
    """The caller goes away while the statement waits for the key's row lock.

    The statement runs on (shielded) and takes the lease when the lock is released; the
    event it stored is answered at once, not after the lease expired.
    """
    async with serve(lease_ttl_seconds=60) as srv:
        await _turns(srv, "first")  # the key's row exists, its lease free
        url = srv.runtime.engine.url.set(drivername="postgresql")
        other = await asyncpg.connect(url.render_as_string(hide_password=False))
        try:
            tx = other.transaction()
            await tx.start()
            await other.execute("SELECT 1 FROM session_keys WHERE key = $1 FOR UPDATE", KEY)
            one = InboundEvent.from_text("webhook", "c", "u", "second")
            accepting = asyncio.create_task(srv.runtime.inbox.accept([one]))
            await wait_until_blocked(other, "WITH")
            accepting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await accepting
            await tx.commit()
        finally:
            await other.close()
        result = await srv.runtime.inbox.wait_for_replies(one.event_id, 10)
        assert result.done and result.replies[0].text
