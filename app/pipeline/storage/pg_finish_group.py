"""PostgreSQL: the ends of turns of several keys, finishing at the same moment, in one statement.

A turn's end is one statement (`pg_turn.FINISH`), a round trip and a commit of its own.
Under load, tens of turns end every few milliseconds, each with that round trip and that
commit, where the writes themselves are the smaller part (`bench/RESULTS.md`). As with
events accepted together (`pg_group_insert`), the ends that arrive while earlier ones are
being stored wait for the next statement together: one statement that is the single end's
statement repeated once per turn (its parameters and CTEs renamed `…_0`, `…_1`, …), so
each turn keeps its own fence, its own all-or-nothing condition and its own reads. Turns
of different keys write different rows; one transaction commits them all.

Each caller gets its own turn's columns, named as `pg_turn.FINISH`'s, after the statement
committed; an end arriving while fewer than `max_statements` are in flight starts one at
once, so a quiet gateway waits for nothing. Groups have 2 or 4 turns of one kind (handing
the run slot on, or not), so a connection prepares few statement shapes. The statement of
four is ~25 KB: asyncpg keeps it prepared only because the engine raises its
`max_cacheable_statement_size` (`app.db.engine.driver_connect_args`); above the limit it
was prepared and planned anew on every call, which cost more than the group saved.

A statement the server rejected as a whole (a value of one turn's data, or a deadlock with
another transaction that locks rows of two of its keys in the other order) is redone one
turn per statement: only the bad turn fails. Any other failure (the connection broke)
fails the whole group: whether it committed is unknown, as for a single end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import visitors

from app.db import direct
from app.pipeline.storage.pg_turn import FINISH, finish_statement

# Errors the server raises for a statement it did not carry out, where one turn per
# statement may succeed: a value of one turn's data, or a deadlock.
_RETRY_ONE_BY_ONE = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.TransactionRollbackError,
)
# How many turns a group statement ends (largest first); fewer waiting: a single end.
SIZES = (4, 2)


def _renamed(statement: Any, suffix: str) -> Any:
    """A copy of `statement` whose bound parameters and CTEs are named with `suffix`."""

    def bind(element: Any) -> None:
        element.key = element.key + suffix

    def cte(element: Any) -> None:
        element.name = element.name + suffix

    return visitors.cloned_traverse(statement, {}, {"bindparam": bind, "cte": cte})


def _grouped(turns: int, hand_on: bool) -> Any:
    """`turns` copies of the end's statement in one: turn i's parameters and columns end in `_i`."""
    columns = []
    for i in range(turns):
        one = _renamed(finish_statement(hand_on=hand_on), f"_{i}")
        columns += [column.label(f"{column.name}_{i}") for column in one.selected_columns]
    return select(*columns)


_KINDS = (False, True)  # whether the ends hand the run slot on
_GROUPED = {(n, hand_on): direct.Direct(_grouped(n, hand_on)) for n in SIZES for hand_on in _KINDS}
# The columns of one turn's end, by kind.
_COLUMNS = {kind: [c.name for c in finish_statement(hand_on=kind).selected_columns] for kind in _KINDS}


@dataclass
class _Waiting:
    params: dict[str, Any]
    hand_on: bool
    ended: asyncio.Future[Mapping[str, Any]]  # the turn's columns, as `FINISH` returns them


class FinishGroup:
    """Ends turns, those arriving together in one statement (see the module).

    `max_statements`: statements in flight at once (each holds a connection).
    """

    def __init__(self, engine: AsyncEngine, *, max_statements: int = 4) -> None:
        self.engine = engine
        self.max_statements = max_statements
        self._waiting: list[_Waiting] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def finish(self, params: dict[str, Any], *, hand_on: bool) -> Mapping[str, Any]:
        """Run `pg_turn.FINISH[hand_on]` with `params`, perhaps with other turns' ends."""
        waiting = _Waiting(params, hand_on, asyncio.get_running_loop().create_future())
        self._waiting.append(waiting)
        if self._running < self.max_statements:
            self._running += 1
            task = asyncio.create_task(self._end_waiting())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await waiting.ended

    async def _end_waiting(self) -> None:
        try:
            while self._waiting:
                group: list[_Waiting] = []
                try:
                    async with direct.connect(self.engine) as conn:
                        # Taken once the connection is ours: what arrived meanwhile goes too.
                        group = self._take()
                        if not group:
                            return
                        rows = await _run(conn, group)
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
                for waiting, row in zip(group, rows, strict=True):
                    _answer(waiting, row)
        finally:
            self._running -= 1

    def _take(self) -> list[_Waiting]:
        """The longest-waiting end and the others of its kind, as many as a group holds.

        An end whose caller was cancelled meanwhile (the gateway stopping) is left out: it
        writes nothing, as a single end cancelled before its statement was sent."""
        self._waiting = [w for w in self._waiting if not w.ended.done()]
        if not self._waiting:
            return []
        kind = self._waiting[0].hand_on
        alike = [w for w in self._waiting if w.hand_on == kind]
        size = next((n for n in SIZES if len(alike) >= n), 1)
        group = alike[:size]
        taken = {id(w) for w in group}
        self._waiting = [w for w in self._waiting if id(w) not in taken]
        return group

    async def _one_by_one(self, group: list[_Waiting]) -> None:
        for waiting in group:
            try:
                async with direct.connect(self.engine) as conn:
                    [row] = await _run(conn, [waiting])
            except Exception as exc:
                _fail([waiting], exc)
            else:
                _answer(waiting, row)


async def _run(conn: direct.DirectConnection, group: list[_Waiting]) -> list[Mapping[str, Any]]:
    """The group's statement; each turn's columns under `FINISH`'s names."""
    hand_on = group[0].hand_on
    if len(group) == 1:
        return [await FINISH[hand_on].one(conn, group[0].params)]
    params = {f"{name}_{i}": value for i, w in enumerate(group) for name, value in w.params.items()}
    row = await _GROUPED[len(group), hand_on].one(conn, params)
    return [{name: row[f"{name}_{i}"] for name in _COLUMNS[hand_on]} for i in range(len(group))]


def _answer(waiting: _Waiting, row: Mapping[str, Any]) -> None:
    if not waiting.ended.done():
        waiting.ended.set_result(row)


def _fail(group: list[_Waiting], exc: BaseException) -> None:
    for waiting in group:
        if not waiting.ended.done():
            waiting.ended.set_exception(exc)
