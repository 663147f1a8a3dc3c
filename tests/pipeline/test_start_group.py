"""PostgreSQL: starts of turns of several keys arriving together share one statement.

`PostgresStore.start` lets the starts that arrive while one is being written wait for the
next statement together (`pg_start_group`). Each turn keeps its own fence, its own
conditions and its own first reads: these tests start several keys' turns at once on a real
database and check what each wrote, what each read and what each caller was told.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox, messages, runs, sessions
from app.errors import LeaseLost, RowsCanceled
from app.pipeline.storage.postgres import PostgresStore
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from tests.pipeline.support import TOGETHER, accept, end, lease_of, one_refused, plan


async def _taken(store: PostgresStore, chat: str, *texts: str) -> tuple[SessionLease, list[Any]]:
    await accept(store, *texts, chat=chat)
    lease = await lease_of(store, key=f"webhook:{chat}")
    return lease, await store.next_rows(lease.key, 1)


async def _stored(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        users = await conn.execute(select(messages.c.content).where(messages.c.role == "user"))
        counted = await conn.execute(select(inbox.c.session_key).where(inbox.c.attempts == 1))
        return {
            "users": sorted(r[0] for r in users),
            "counted": sorted(r[0] for r in counted),
            "runs": (await conn.execute(select(func.count()).select_from(runs))).scalar_one(),
            "sessions": (await conn.execute(select(func.count()).select_from(sessions))).scalar_one(),
        }


async def test_starts_arriving_together_each_write_and_read_their_own_turn(pg_store: PostgresStore) -> None:
    # Every key had a turn before, so each start continues its own session and reads its
    # own history: a mix-up between the copies of the statement would show here.
    for i in range(TOGETHER):
        lease, rows = await _taken(pg_store, f"c{i}", f"first {i}")
        first = await pg_store.start(lease, plan(rows, count_attempt=True))
        await pg_store.finish(lease, end(first, rows, f"answer {i}", release=True))
    taken = [await _taken(pg_store, f"c{i}", f"second {i}") for i in range(TOGETHER)]

    started = await asyncio.gather(
        *(pg_store.start(lease, plan(rows, count_attempt=True)) for lease, rows in taken)
    )

    for i, s in enumerate(started):
        assert s.session.key == f"webhook:c{i}"
        assert s.seqs == [3]
        assert s.window is not None
        assert [(m.role, m.content) for m in s.window] == [
            ("user", f"first {i}"),
            ("assistant", f"answer {i}"),
            ("user", f"second {i}"),
        ]
    assert len({s.run_id for s in started}) == TOGETHER
    stored = await _stored(pg_store.engine)
    assert stored["users"] == sorted(
        [f"first {i}" for i in range(TOGETHER)] + [f"second {i}" for i in range(TOGETHER)]
    )
    assert stored["runs"] == 2 * TOGETHER
    assert stored["sessions"] == TOGETHER


async def test_a_lost_lease_in_a_group_writes_nothing_and_the_others_start(pg_store: PostgresStore) -> None:
    taken = [await _taken(pg_store, f"c{i}", f"hello {i}") for i in range(TOGETHER)]
    lost = 3
    assert await pg_store.release(taken[lost][0])
    await lease_of(pg_store, "another replica", key="webhook:c3")

    others = await one_refused(
        (pg_store.start(lease, plan(rows, count_attempt=True)) for lease, rows in taken),
        lost,
        LeaseLost,
    )
    assert await _stored(pg_store.engine) == {
        "users": sorted(f"hello {i}" for i in others),
        "counted": sorted(f"webhook:c{i}" for i in others),
        "runs": TOGETHER - 1,
        "sessions": TOGETHER - 1,
    }


async def test_a_canceled_row_in_a_group_starts_nothing_and_the_others_start(
    pg_store: PostgresStore, pg_engine: AsyncEngine
) -> None:
    taken = [await _taken(pg_store, f"c{i}", f"hello {i}") for i in range(TOGETHER)]
    canceled = 6
    async with pg_engine.begin() as conn:
        await conn.execute(
            inbox.update().where(inbox.c.id == taken[canceled][1][0].id).values(status="canceled")
        )

    others = await one_refused(
        (pg_store.start(lease, plan(rows, count_attempt=True)) for lease, rows in taken),
        canceled,
        RowsCanceled,
    )
    stored = await _stored(pg_store.engine)
    assert stored["users"] == sorted(f"hello {i}" for i in others)
    assert stored["runs"] == TOGETHER - 1


async def test_a_start_the_database_refuses_fails_alone(pg_store: PostgresStore) -> None:
    """A NUL character is no PostgreSQL text: that start's statement is refused as a whole,
    and the group is started again one turn at a time."""
    taken = [await _taken(pg_store, f"c{i}", f"hello {i}") for i in range(TOGETHER)]
    bad = 5

    def plan_of(i: int, rows: list[Any]) -> Any:
        p = plan(rows, count_attempt=True)
        if i == bad:
            p = replace(p, user_messages=[ChatMessage(role="user", content="\x00")])
        return p

    others = await one_refused(
        (pg_store.start(lease, plan_of(i, rows)) for i, (lease, rows) in enumerate(taken)),
        bad,
        Exception,
        not_as=LeaseLost,
    )
    stored = await _stored(pg_store.engine)
    assert stored["users"] == sorted(f"hello {i}" for i in others)
    # Every attempt counts, the refused one too (on its own, after its start failed).
    assert stored["counted"] == sorted(f"webhook:c{i}" for i in range(TOGETHER))
    assert stored["runs"] == TOGETHER - 1
