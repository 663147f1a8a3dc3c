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
an event twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app import tracing
from app.db import direct
from app.events import InboundEvent
from app.pipeline.storage.pg_inbox import INSERT_MANY

# Errors the server raises for a statement it did not carry out, where carrying out its
# events one per statement may succeed: a value of one event, or a deadlock.
_RETRY_ONE_BY_ONE = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.TransactionRollbackError,
)


@dataclass
class _Waiting:
    event: InboundEvent
    now: datetime
    stored: asyncio.Future[bool]  # False: a duplicate
    trace: dict[str, Any] | None = None  # the caller's trace context (app.tracing)


class GroupInsert:
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
        self.engine = engine
        self._insert_one = insert_one
        self.max_rows = max_rows
        self.max_statements = max_statements  # in flight at once (each holds a connection)
        self._waiting: list[_Waiting] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def insert(self, event: InboundEvent, now: datetime) -> bool:
        waiting = _Waiting(event, now, asyncio.get_running_loop().create_future(), tracing.carrier())
        self._waiting.append(waiting)
        if self._running < self.max_statements:
            self._running += 1
            task = asyncio.create_task(self._store_waiting())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await waiting.stored

    async def _store_waiting(self) -> None:
        try:
            while self._waiting:
                group: list[_Waiting] = []
                try:
                    async with direct.connect(self.engine) as conn:
                        # Taken once the connection is ours: what arrived meanwhile goes too.
                        group = self._take()
                        if not group:
                            return
                        rows = await INSERT_MANY.rows(conn, _arrays(group))
                except Exception as exc:
                    group = group or self._take()  # no connection: this group fails
                    if isinstance(exc, _RETRY_ONE_BY_ONE) and len(group) > 1:
                        await self._one_by_one(group)
                    else:
                        _fail(group, exc)
                    continue
                except BaseException as exc:  # cancelled: the gateway is stopping
                    _fail(group or self._take(), exc)
                    raise
                new = {row["event_id"] for row in rows}
                for waiting in group:
                    self._answer(waiting, waiting.event.event_id in new)
        finally:
            self._running -= 1

    def _take(self) -> list[_Waiting]:
        group, self._waiting = self._waiting[: self.max_rows], self._waiting[self.max_rows :]
        return group

    @staticmethod
    def _answer(waiting: _Waiting, stored: bool) -> None:
        if not waiting.stored.done():
            waiting.stored.set_result(stored)

    async def _one_by_one(self, group: list[_Waiting]) -> None:
        for waiting in group:
            try:
                stored = await self._insert_one(waiting.event, waiting.now)
            except Exception as exc:
                _fail([waiting], exc)
            else:
                self._answer(waiting, stored)


def _fail(group: list[_Waiting], exc: BaseException) -> None:
    for waiting in group:
        if not waiting.stored.done():
            waiting.stored.set_exception(exc)


def _arrays(group: list[_Waiting]) -> dict[str, list[Any]]:
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
