"""PostgreSQL: single events accepted at the same moment are stored by one statement.

`Inbox.accept` of one event goes through `GroupInsert`: what arrives while a statement is
in flight waits for the next one, stored in arrival order with the same dedup. These
tests run the real inbox on a real database and look at what it stored and which
statements it sent.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy import make_url, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db.models import inbox
from app.events import InboundEvent, TextPart
from app.pipeline.inbox import Inbox
from tests.support.pg_probe import asyncpg_dsn, statements, wait_until_blocked


def _event(text: str, *, chat: str = "c", external_id: str | None = None) -> InboundEvent:
    return InboundEvent.from_text("webhook", chat, "u", text, external_id=external_id)


async def _stored(engine: AsyncEngine) -> list[tuple[str, str]]:
    """(event id, text) of the inbox rows, in inbox order."""
    async with engine.connect() as conn:
        rows = await conn.execute(select(inbox.c.event_id, inbox.c.payload).order_by(inbox.c.id))
        return [(r[0], r[1]["parts"][0]["text"]) for r in rows]


async def test_events_accepted_together_are_one_statement_in_arrival_order(pg_engine: AsyncEngine) -> None:
    box = Inbox(pg_engine)
    woken: list[str] = []
    box.on_accepted = woken.append
    events = [_event(f"m{i}", chat=f"c{i % 7}", external_id=f"x{i}" if i % 2 else None) for i in range(40)]

    with statements(pg_engine) as sent:
        results = await asyncio.gather(*(box.accept([e]) for e in events))

    inserts = [q for q in sent if q.lstrip().startswith("INSERT INTO inbox")]
    assert 1 <= len(inserts) < len(events) // 4  # grouped: the first alone, the rest together
    assert [r[0].event_id for r in results] == [e.event_id for e in events]
    assert not any(r[0].duplicate for r in results)
    # In the order `accept` was called: a key's events are handled in inbox order.
    assert await _stored(pg_engine) == [(e.event_id, f"m{i}") for i, e in enumerate(events)]
    assert sorted(woken) == sorted(e.session_key for e in events)  # the dispatcher was told of each


async def test_a_webhook_delivered_three_times_at_once_is_one_event(pg_engine: AsyncEngine) -> None:
    box = Inbox(pg_engine)
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
    box = Inbox(pg_engine)
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
    box = Inbox(pg_engine)
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


async def test_a_caller_cancelled_while_waiting_still_has_its_event_stored_and_handled(
    pg_engine: AsyncEngine,
) -> None:
    box = Inbox(pg_engine)
    woken: list[str] = []
    box.on_accepted = woken.append
    ahead = [asyncio.create_task(box.accept([_event(f"ahead {i}")])) for i in range(3)]
    late = _event("late", chat="late")
    waiting = asyncio.create_task(box.accept([late]))
    await asyncio.sleep(0)  # all four wait for their statement now, none has a connection yet
    waiting.cancel()

    await asyncio.gather(*ahead)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    for _ in range(100):  # its statement ends after the caller left
        if late.session_key in woken:
            break
        await asyncio.sleep(0.02)
    assert late.session_key in woken  # the dispatcher still learns of it: it is not stranded
    assert (late.event_id, "late") in await _stored(pg_engine)


async def test_without_a_database_every_waiting_caller_gets_the_error(pg_url: str) -> None:
    gone = create_async_engine(make_url(pg_url).set(host="127.0.0.1", port=9))  # nothing listens
    try:
        box = Inbox(gone)
        results = await asyncio.wait_for(
            asyncio.gather(*(box.accept([_event(f"m{i}")]) for i in range(10)), return_exceptions=True),
            timeout=10,
        )
        # Each caller is answered (no one waits for a statement that will never come).
        assert all(isinstance(r, Exception) for r in results), results
        assert len({type(r) for r in results}) == 1, results
    finally:
        await gone.dispose()
