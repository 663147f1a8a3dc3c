"""PostgreSQL: the starts of turns of several keys, starting at the same moment, in one statement.

A turn's start is one statement (`pg_start.START`): a round trip and a commit of its own.
Under load, tens of turns start every few milliseconds. As with their ends
(`pg_finish_group`), the starts that arrive while earlier ones are being written wait for
the next statement together: the single start's statement repeated once per turn (its
parameters and CTEs renamed `…_0`, `…_1`, …, its one-row subquery named `one_0`, …), so
each turn keeps its own fence, its own locking reads, its own conditions and its own first
reads (history window, memory recall). Turns of different keys write different rows; one
transaction commits them all, without a WAL flush, as a single start does (`lax_commit`).

Each caller gets its own turn's columns, named as `pg_start.START`'s. Groups have 2 or 4
starts of one kind (the same memory-recall variant), so a connection prepares few
statement shapes; the engine keeps statements up to 64 KiB prepared
(`app.db.engine.driver_connect_args`). A statement the server rejected as a whole (a value
of one turn's data, or a deadlock with a transaction that locks rows of two of its keys in
the other order) is redone one start per statement; any other failure fails the group
(`pg_batcher`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import direct
from app.pipeline.storage.pg_batcher import StatementBatcher, Waiting, renamed
from app.pipeline.storage.pg_start import START, start_statement

# How many turns a group statement starts (largest first); fewer waiting: a single start.
SIZES = (4, 2)
_KINDS = (None, False, True)  # the memory-recall variant: none, without or with the user scope


def _grouped(turns: int, recall: bool | None) -> Any:
    """`turns` copies of the start's statement in one: turn i's parameters and columns end in `_i`."""
    columns: list[Any] = []
    froms: list[Any] = []
    for i in range(turns):
        one = renamed(start_statement(recall, one=f"one_{i}"), f"_{i}")
        columns += [column.label(f"{column.name}_{i}") for column in one.selected_columns]
        froms += one.get_final_froms()
    return select(*columns).select_from(*froms)


_GROUPED = {(n, recall): direct.Direct(_grouped(n, recall)) for n in SIZES for recall in _KINDS}
# The columns of one turn's start, by kind.
_COLUMNS = {kind: [c.name for c in start_statement(kind).selected_columns] for kind in _KINDS}


class _Start(Waiting[Mapping[str, Any]]):  # answer: the turn's columns, as `START` returns them
    __slots__ = ("params", "recall")

    def __init__(self, params: dict[str, Any], recall: bool | None) -> None:
        super().__init__()
        self.params = params
        self.recall = recall


class StartGroup(StatementBatcher[_Start, Mapping[str, Any]]):
    """Starts turns, those arriving together in one statement (see the module).

    `max_statements`: statements in flight at once (each holds a connection).
    """

    def __init__(self, engine: AsyncEngine, *, max_statements: int = 4) -> None:
        super().__init__(engine, max_statements=max_statements)

    async def start(self, params: dict[str, Any], *, recall: bool | None) -> Mapping[str, Any]:
        """Run `pg_start.START[recall]` with `params`, perhaps with other turns' starts."""
        return await self.submit(_Start(params, recall))

    def take(self) -> list[_Start]:
        """The longest-waiting start and the others of its kind, as many as a group holds.

        A start whose caller was cancelled meanwhile is left out: it writes nothing, as a
        single start cancelled before its statement was sent."""
        self._waiting = [w for w in self._waiting if not w.answer.done()]
        if not self._waiting:
            return []
        kind = self._waiting[0].recall
        alike = [w for w in self._waiting if w.recall == kind]
        size = next((n for n in SIZES if len(alike) >= n), 1)
        group = alike[:size]
        taken = {id(w) for w in group}
        self._waiting = [w for w in self._waiting if id(w) not in taken]
        return group

    async def run(self, conn: direct.DirectConnection, group: list[_Start]) -> list[Mapping[str, Any]]:
        """The group's statement; each turn's columns under `START`'s names."""
        recall = group[0].recall
        if len(group) == 1:
            return [await START[recall].one(conn, group[0].params)]
        params = {f"{name}_{i}": value for i, w in enumerate(group) for name, value in w.params.items()}
        row = await _GROUPED[len(group), recall].one(conn, params)
        return [{name: row[f"{name}_{i}"] for name in _COLUMNS[recall]} for i in range(len(group))]

    async def run_one(self, waiting: _Start) -> Mapping[str, Any]:
        async with direct.connect(self.engine) as conn:
            [row] = await self.run(conn, [waiting])
        return row
