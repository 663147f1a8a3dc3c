"""PostgreSQL: single events accepted at the same time are stored by one statement.

Every webhook request stores its event and commits before it is answered. Under load many
requests do that at the same moment, each with a statement of its own: a round trip, a
transaction and a wake-up of a PostgreSQL backend per event, where the insert itself is
the small part (`bench/RESULTS.md`). `GroupInsert` lets the events that arrive while
earlier ones are being stored wait for the next statement together: one multi-row insert
(`unnest` of arrays, so one prepared statement for any number of rows) in arrival order,
with the same dedup on `(channel, external_id)`. Every caller is answered after the
statement that holds its event committed, as before; an event arriving with no statement
in flight starts one at once, so a quiet gateway waits for nothing.

A statement the server rejected as a whole because of one event's data (too long a
value, a duplicate event id) is retried one event per statement, so only the bad event
fails. So is one PostgreSQL aborted as a deadlock: two groups on two replicas holding
copies of the same two deliveries in opposite orders each wait for the other's insert
(`deadlock_timeout`, 1 s by default, then one of them is aborted; a one-row insert
cannot take part in such a cycle on its own). Any other failure (the connection broke)
fails the whole group: whether it committed is unknown, and inserting again could store
an event twice. The waiting, grouping and retrying are `pg_batcher.StatementBatcher`'s.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app import tracing
from app.db import direct
from app.events import InboundEvent
from app.pipeline.storage.pg_batcher import StatementBatcher, Waiting
from app.pipeline.storage.pg_inbox import INSERT_MANY


class _Event(Waiting[bool]):  # answer: False for a duplicate
    __slots__ = ("event", "now", "trace")

    def __init__(self, event: InboundEvent, now: datetime) -> None:
        super().__init__()
        self.event = event
        self.now = now
        self.trace = tracing.carrier()  # the caller's trace context (app.tracing)


class GroupInsert(StatementBatcher[_Event, bool]):
    """Stores single events, those arriving together in one statement (see the module).

    `insert` returns whether the event was stored (False: a duplicate).
    `insert_one(event, now)` stores one event alone, the same way (the retry above).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        insert_one: Callable[[InboundEvent, datetime], Awaitable[bool]],
        max_rows: int = 500,
        max_statements: int = 4,
    ) -> None:
        super().__init__(engine, max_statements=max_statements)
        self._insert_one = insert_one
        self.max_rows = max_rows

    async def insert(self, event: InboundEvent, now: datetime) -> bool:
        return await self.submit(_Event(event, now))

    def take(self) -> list[_Event]:
        group, self._waiting = self._waiting[: self.max_rows], self._waiting[self.max_rows :]
        return group

    async def run(self, conn: direct.DirectConnection, group: list[_Event]) -> list[bool]:
        rows = await INSERT_MANY.rows(conn, _arrays(group))
        new = {row["event_id"] for row in rows}
        return [waiting.event.event_id in new for waiting in group]

    async def run_one(self, waiting: _Event) -> bool:
        return await self._insert_one(waiting.event, waiting.now)


def _arrays(group: list[_Event]) -> dict[str, list[Any]]:
    events = [w.event for w in group]
    return {
        "e": [e.event_id for e in events],
        "c": [e.channel for e in events],
        "x": [e.external_id for e in events],
        "k": [e.session_key for e in events],
        "p": [e.model_dump_json() for e in events],
        "t": [w.now for w in group],
        "j": [json.dumps(w.trace) if w.trace else None for w in group],
    }
