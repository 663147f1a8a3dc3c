"""PostgreSQL: single events accepted at the same moment are stored together (`PostgresStore`).

What arrives while an insert is in flight waits for the next one (`pg_group_insert`). These
tests run the store on a real database: each event is stored once, in arrival order, a bad
one fails alone, and nobody waits for ever.
"""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy import make_url, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.channel import AcceptResult
from app.db.models import inbox
from app.events import InboundEvent, TextPart
from app.pipeline.storage.postgres import PostgresStore
from app.sessions.store import Lifecycle, SessionStore
from tests.support.pg_probe import asyncpg_dsn, wait_until_blocked


class Box:
    """The PostgreSQL store's accept of single events, as `Inbox.accept` was."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.store = PostgresStore(engine, SessionStore(engine, Lifecycle()), lease_ttl=30)

    async def accept(self, events: list[InboundEvent]) -> list[AcceptResult]:
        return (await self.store.accept(events)).results


def _event(text: str, *, chat: str = "c", external_id: str | None = None) -> InboundEvent:
    return InboundEvent.from_text("webhook", chat, "u", text, external_id=external_id)


async def _stored(engine: AsyncEngine) -> list[tuple[str, str]]:
    """(event id, text) of the inbox rows, in inbox order."""
    async with engine.connect() as conn:
        rows = await conn.execute(select(inbox.c.event_id, inbox.c.payload).order_by(inbox.c.id))
        return [(r[0], r[1]["parts"][0]["text"]) for r in rows]


async def test_events_accepted_together_are_stored_in_arrival_order(pg_engine: AsyncEngine) -> None:
    box = Box(pg_engine)
    events = [_event(f"m{i}", chat=f"c{i % 7}", external_id=f"x{i}" if i % 2 else None) for i in range(40)]

    results = await asyncio.gather(*(box.accept([e]) for e in events))

    assert [r[0].event_id for r in results] == [e.event_id for e in events]
    assert not any(r[0].duplicate for r in results)
    # In the order `accept` was called: a key's events are handled in inbox order.
    assert await _stored(pg_engine) == [(e.event_id, f"m{i}") for i, e in enumerate(events)]


async def test_a_webhook_delivered_three_times_at_once_is_one_event(pg_engine: AsyncEngine) -> None:
    box = Box(pg_engine)
    others = [_event(f"other {i}", external_id=f"o{i}") for i in range(5)]
    copies = [_event("hello", external_id="same") for _ in range(3)]  # three event ids

    results = await asyncio.gather(*(box.accept([e]) for e in [*others[:2], *copies, *others[2:]]))

    stored = await _stored(pg_engine)
    assert [text for _, text in stored].count("hello") == 1
    original = next(event_id for event_id, text in stored if text == "hello")
    answers = [r[0] for r in results[2:5]]
    assert [a.duplicate for a in answers] == [False, True, True]  # the first one in is stored
    assert {a.event_id for a in answers} == {original}  # the copies are told the original's id
    assert len(stored) == 6


async def test_one_bad_event_fails_alone_and_the_rest_are_stored(pg_engine: AsyncEngine) -> None:
    box = Box(pg_engine)
    first = _event("first")
    clash = first.model_copy(update={"external_id": "new", "parts": (TextPart(text="clash"),)})  # same id
    good = [_event(f"good {i}") for i in range(6)]
    await box.accept([first])

    results = await asyncio.gather(
        *(box.accept([e]) for e in [good[0], good[1], clash, *good[2:]]), return_exceptions=True
    )

    assert isinstance(results[2], Exception) and "event_id" in str(results[2])
    assert all(isinstance(r, list) and not r[0].duplicate for i, r in enumerate(results) if i != 2)
    assert [text for _, text in await _stored(pg_engine)] == ["first", *(f"good {i}" for i in range(6))]


async def test_a_group_that_deadlocks_with_another_insert_loses_nothing(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    """Another replica's transaction stores copies of the same two deliveries in the other order.

    The group inserts x, then waits for the other transaction's y; the other transaction
    then inserts x and waits for the group: PostgreSQL aborts one of them. Whichever it
    is, each delivery ends up stored once and every caller gets an answer.
    """
    box = Box(pg_engine)
    x, y = _event("x", external_id="ext-x"), _event("y", external_id="ext-y")
    other, watcher = await asyncpg.connect(asyncpg_dsn(pg_url)), await asyncpg.connect(asyncpg_dsn(pg_url))
    insert = (
        "INSERT INTO inbox (event_id, channel, external_id, session_key, payload, status, attempts,"
        " created_at, updated_at) VALUES ($1, 'webhook', $2, 'webhook:c', '{}', 'pending', 0, now(), now())"
    )
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute(insert, "other-y", "ext-y")
        accepting = asyncio.gather(box.accept([x]), box.accept([y]))  # one group: x, then y
        await wait_until_blocked(watcher, "INSERT INTO inbox")
        try:
            await other.execute(insert, "other-x", "ext-x")  # now each waits for the other
        except asyncpg.DeadlockDetectedError:
            await tx.rollback()
        else:
            await tx.commit()  # the group's statement was aborted: it retries one by one
        results = await asyncio.wait_for(accepting, 10)
    finally:
        await other.close()
        await watcher.close()

    stored = await _stored_by_external_id(pg_engine)
    assert sorted(stored) == ["ext-x", "ext-y"]  # each once
    for [result], event in zip(results, (x, y), strict=True):
        # Either ours was stored, or the other transaction's copy and ours is a duplicate of it.
        assert result.event_id == stored[event.external_id]  # type: ignore[index]
        assert result.duplicate == (result.event_id != event.event_id)


async def _stored_by_external_id(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(inbox.c.external_id, inbox.c.event_id))
        return {r[0]: r[1] for r in rows}


async def test_without_a_database_every_waiting_caller_gets_the_error(pg_url: str) -> None:
    gone = create_async_engine(make_url(pg_url).set(host="127.0.0.1", port=9))  # nothing listens
    try:
        box = Box(gone)
        results = await asyncio.wait_for(
            asyncio.gather(*(box.accept([_event(f"m{i}")]) for i in range(10)), return_exceptions=True),
            timeout=10,
        )
        # Each caller is answered (no one waits for a statement that will never come).
        assert all(isinstance(r, Exception) for r in results), results
        assert len({type(r) for r in results}) == 1, results
    finally:
        await gone.dispose()
