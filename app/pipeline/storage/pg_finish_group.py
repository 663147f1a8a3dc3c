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
fails the whole group: whether it committed is unknown, as for a single end. The waiting,
grouping and retrying are `pg_batcher.StatementBatcher`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import direct
from app.pipeline.storage.pg_batcher import StatementBatcher, Waiting, renamed
from app.pipeline.storage.pg_turn import FINISH, finish_statement

# How many turns a group statement ends (largest first); fewer waiting: a single end.
SIZES = (4, 2)


def _grouped(turns: int, hand_on: bool) -> Any:
    """`turns` copies of the end's statement in one: turn i's parameters and columns end in `_i`."""
    columns = []
    for i in range(turns):
        one = renamed(finish_statement(hand_on=hand_on), f"_{i}")
        columns += [column.label(f"{column.name}_{i}") for column in one.selected_columns]
    return select(*columns)


_KINDS = (False, True)  # whether the ends hand the run slot on
_GROUPED = {(n, hand_on): direct.Direct(_grouped(n, hand_on)) for n in SIZES for hand_on in _KINDS}
# The columns of one turn's end, by kind.
_COLUMNS = {kind: [c.name for c in finish_statement(hand_on=kind).selected_columns] for kind in _KINDS}


class _End(Waiting[Mapping[str, Any]]):  # answer: the turn's columns, as `FINISH` returns them
    __slots__ = ("hand_on", "params")

    def __init__(self, params: dict[str, Any], hand_on: bool) -> None:
        super().__init__()
        self.params = params
        self.hand_on = hand_on


class FinishGroup(StatementBatcher[_End, Mapping[str, Any]]):
    """Ends turns, those arriving together in one statement (see the module).

    `max_statements`: statements in flight at once (each holds a connection).
    """

    def __init__(self, engine: AsyncEngine, *, max_statements: int = 4) -> None:
        super().__init__(engine, max_statements=max_statements)

    async def finish(self, params: dict[str, Any], *, hand_on: bool) -> Mapping[str, Any]:
        """Run `pg_turn.FINISH[hand_on]` with `params`, perhaps with other turns' ends."""
        return await self.submit(_End(params, hand_on))

    def take(self) -> list[_End]:
        """The longest-waiting end and the others of its kind, as many as a group holds.

        An end whose caller was cancelled meanwhile (the gateway stopping) is left out: it
        writes nothing, as a single end cancelled before its statement was sent."""
        self._waiting = [w for w in self._waiting if not w.answer.done()]
        if not self._waiting:
            return []
        kind = self._waiting[0].hand_on
        alike = [w for w in self._waiting if w.hand_on == kind]
        size = next((n for n in SIZES if len(alike) >= n), 1)
        group = alike[:size]
        taken = {id(w) for w in group}
        self._waiting = [w for w in self._waiting if id(w) not in taken]
        return group

    async def run(self, conn: direct.DirectConnection, group: list[_End]) -> list[Mapping[str, Any]]:
        """The group's statement; each turn's columns under `FINISH`'s names."""
        hand_on = group[0].hand_on
        if len(group) == 1:
            return [await FINISH[hand_on].one(conn, group[0].params)]
        params = {f"{name}_{i}": value for i, w in enumerate(group) for name, value in w.params.items()}
        row = await _GROUPED[len(group), hand_on].one(conn, params)
        return [{name: row[f"{name}_{i}"] for name in _COLUMNS[hand_on]} for i in range(len(group))]

    async def run_one(self, waiting: _End) -> Mapping[str, Any]:
        async with direct.connect(self.engine) as conn:
            [row] = await self.run(conn, [waiting])
        return row
