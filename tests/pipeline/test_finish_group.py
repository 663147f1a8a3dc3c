"""PostgreSQL: ends of turns of several keys arriving together share one statement.

`PostgresStore.finish` lets the ends that arrive while one is being stored wait for the
next statement together (`pg_finish_group`). Each turn keeps its own fence and its own
all-or-nothing: these tests end several keys' turns at once on a real database and check
what each wrote and what each caller was told.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox, messages, outbox
from app.errors import LeaseLost
from app.pipeline.storage.postgres import PostgresStore
from app.sessions.lease import SessionLease
from tests.pipeline.support import TOGETHER, accept, end, lease_of, one_refused, plan


async def _started(store: PostgresStore, chat: str) -> tuple[SessionLease, Any, list[Any]]:
    await accept(store, f"hello from {chat}", chat=chat)
    lease = await lease_of(store, key=f"webhook:{chat}")
    rows = await store.next_rows(lease.key, 1)
    started = await store.start(lease, plan(rows, count_attempt=True))
    return lease, started, rows


async def _stored(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        done = await conn.execute(select(inbox.c.session_key).where(inbox.c.status == "done"))
        answers = await conn.execute(select(messages.c.content).where(messages.c.role == "assistant"))
        replies = await conn.execute(select(func.count()).select_from(outbox))
        return {
            "done": sorted(r[0] for r in done),
            "answers": sorted(r[0] for r in answers),
            "replies": replies.scalar_one(),
        }


async def test_ends_arriving_together_each_write_their_own_turn(pg_store: PostgresStore) -> None:
    turns = [await _started(pg_store, f"c{i}") for i in range(TOGETHER)]

    finished = await asyncio.gather(
        *(
            pg_store.finish(lease, end(started, rows, f"answer {i}"))
            for i, (lease, started, rows) in enumerate(turns)
        )
    )

    assert [f.seq for f in finished] == [2] * TOGETHER  # each its own session's next message
    assert await _stored(pg_store.engine) == {
        "done": sorted(f"webhook:c{i}" for i in range(TOGETHER)),
        "answers": sorted(f"answer {i}" for i in range(TOGETHER)),
        "replies": TOGETHER,
    }


async def test_a_lost_lease_in_a_group_writes_nothing_and_the_others_commit(pg_store: PostgresStore) -> None:
    turns = [await _started(pg_store, f"c{i}") for i in range(TOGETHER)]
    lost = 3
    assert await pg_store.release(turns[lost][0])
    await lease_of(pg_store, "another replica", key="webhook:c3")

    others = await one_refused(
        (
            pg_store.finish(lease, end(started, rows, f"answer {i}"))
            for i, (lease, started, rows) in enumerate(turns)
        ),
        lost,
        LeaseLost,
    )
    assert await _stored(pg_store.engine) == {
        "done": sorted(f"webhook:c{i}" for i in others),
        "answers": sorted(f"answer {i}" for i in others),
        "replies": TOGETHER - 1,
    }


async def test_an_end_the_database_refuses_fails_alone(pg_store: PostgresStore) -> None:
    """A NUL character is no PostgreSQL text: that end's statement is refused as a whole,
    and the group is ended again one turn at a time."""
    turns = [await _started(pg_store, f"c{i}") for i in range(TOGETHER)]
    bad = 5

    others = await one_refused(
        (
            pg_store.finish(lease, end(started, rows, "\x00" if i == bad else f"answer {i}"))
            for i, (lease, started, rows) in enumerate(turns)
        ),
        bad,
        Exception,
        not_as=LeaseLost,
    )
    stored = await _stored(pg_store.engine)
    assert stored["done"] == sorted(f"webhook:c{i}" for i in others)
    assert stored["answers"] == sorted(f"answer {i}" for i in others)
