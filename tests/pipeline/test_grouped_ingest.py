"""PostgreSQL: events accepted at the same moment share one insert (`app.pipeline.inbox._Grouped`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox
from app.events import InboundEvent
from app.pipeline.inbox import Inbox


@contextmanager
def _statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement sent on the engine's pooled connections meanwhile (asyncpg's logger)."""
    seen: list[str] = []

    def logged(query: Any) -> None:
        seen.append(query.query)

    def checkout(dbapi_conn: Any, *_rest: Any) -> None:
        dbapi_conn.driver_connection.add_query_logger(logged)

    pool = engine.sync_engine.pool
    event.listen(pool, "checkout", checkout)
    try:
        yield seen
    finally:
        event.remove(pool, "checkout", checkout)


def _event(i: int, *, external_id: str | None = None) -> InboundEvent:
    return InboundEvent.from_text("webhook", "c", "u", f"message {i}").model_copy(
        update={"external_id": external_id or f"x{i}"}
    )


async def _stored(engine: AsyncEngine) -> list[tuple[str, str | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(inbox.c.event_id, inbox.c.external_id).order_by(inbox.c.id))
    return [(r[0], r[1]) for r in rows]


async def test_events_accepted_together_share_inserts_keep_their_order_and_dedup(
    pg_engine: AsyncEngine,
) -> None:
    inbox_ = Inbox(pg_engine)
    events = [_event(i) for i in range(40)]
    again = _event(99, external_id="x7")  # a platform's redelivery of event 7, in the same wave
    with _statements(pg_engine) as seen:
        results = await asyncio.gather(*(inbox_.accept([e]) for e in [*events, again]))
    inserts = [s for s in seen if s.lstrip().startswith("INSERT INTO inbox")]
    assert 1 <= len(inserts) < 10  # the first one alone, then the queue in a few groups
    accepted = [r for [r] in results]
    assert [r.event_id for r in accepted[:40]] == [e.event_id for e in events]
    assert not any(r.duplicate for r in accepted[:40])
    assert accepted[40].duplicate and accepted[40].event_id == events[7].event_id
    # One row each, in the order they were accepted (their key's order of handling).
    assert await _stored(pg_engine) == [(e.event_id, e.external_id) for e in events]


async def test_a_bad_event_in_a_group_fails_alone(pg_engine: AsyncEngine) -> None:
    inbox_ = Inbox(pg_engine)
    first = inbox_.accept([_event(0)])  # in flight: the rest queue up behind it
    good = [_event(i) for i in range(1, 6)]
    bad = _event(6, external_id="nul\x00byte")  # PostgreSQL text cannot hold a NUL
    outcomes = await asyncio.gather(
        first, *(inbox_.accept([e]) for e in [*good, bad]), return_exceptions=True
    )
    assert not isinstance(outcomes[0], BaseException)
    assert [type(o) for o in outcomes[1:6]] == [list] * 5
    assert isinstance(outcomes[6], Exception)
    stored = {event_id for event_id, _ in await _stored(pg_engine)}
    assert stored == {e.event_id for e in good} | {outcomes[0][0].event_id}
    [later] = await inbox_.accept([_event(7)])  # and the queue is not stuck
    assert later.event_id in {event_id for event_id, _ in await _stored(pg_engine)}


async def test_a_request_cancelled_while_queued_is_not_written_and_blocks_nobody(
    pg_engine: AsyncEngine,
) -> None:
    inbox_ = Inbox(pg_engine)
    writing = asyncio.create_task(inbox_.accept([_event(0)]))
    await asyncio.sleep(0)  # its statement is on its way
    queued = [asyncio.create_task(inbox_.accept([_event(i)])) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    queued[0].cancel()  # the one whose turn it would be to write the next group
    await writing
    with pytest.raises(asyncio.CancelledError):
        await queued[0]
    rest = [r for [r] in await asyncio.gather(*queued[1:])]
    stored = [event_id for event_id, _ in await _stored(pg_engine)]
    assert stored[1:] == [r.event_id for r in rest]
    [later] = await inbox_.accept([_event(4)])
    assert (await _stored(pg_engine))[-1][0] == later.event_id
