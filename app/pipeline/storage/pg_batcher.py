"""PostgreSQL: callers that arrive while earlier ones are being written share one statement.

The machinery under `pg_group_insert` (events accepted together), `pg_start_group` and
`pg_finish_group` (turns starting or ending together; `KindBatcher` runs copies of one
statement side by side, renamed apart by `renamed` and joined by `grouped_statement`).
Each caller puts what it wants written in a waiting item and awaits that item's answer.
While fewer than `max_statements` statements are in flight, an arriving caller starts one
at once, so a quiet gateway waits for nothing; otherwise it waits for the next statement,
together with whoever else arrived meanwhile. The group is taken only once a connection is
ours, so what arrived while it was being acquired goes too.

A statement the server rejected as a whole because of one item's data (too long a value, a
duplicate id) or aborted as a deadlock is carried out again one item at a time, so only the
bad item fails. Any other failure (the connection broke) fails the whole group: whether it
committed is unknown, and writing again could write twice. A cancelled statement (the
gateway stopping) fails its group with the cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import asyncpg
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import visitors

from app.db import direct

# Errors the server raises for a statement it did not carry out, where carrying out its
# items one per statement may succeed: a value of one item, or a deadlock.
RETRY_ONE_BY_ONE = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.TransactionRollbackError,
)

R = TypeVar("R")


class Waiting(Generic[R]):
    """What one caller waits for: `answer` is set after the statement holding it committed."""

    __slots__ = ("answer",)

    def __init__(self) -> None:
        self.answer: asyncio.Future[R] = asyncio.get_running_loop().create_future()


W = TypeVar("W", bound=Waiting)  # type: ignore[type-arg]


class StatementBatcher(Generic[W, R]):
    """Runs waiting items in shared statements (see the module).

    A subclass says which waiting items go together (`take`), how a group is written
    (`run`: one result per item, in order) and how one item is written alone (`run_one`).
    """

    def __init__(self, engine: AsyncEngine, *, max_statements: int = 4) -> None:
        self.engine = engine
        self.max_statements = max_statements  # in flight at once (each holds a connection)
        self._waiting: list[W] = []
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, waiting: W) -> R:
        """Queue `waiting`, start a statement if fewer than `max_statements` run; its answer."""
        self._waiting.append(waiting)
        if self._running < self.max_statements:
            self._running += 1
            task = asyncio.create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await waiting.answer

    def take(self) -> list[W]:
        """The next group, removed from the waiting items; [] when none is left."""
        raise NotImplementedError

    async def run(self, conn: direct.DirectConnection, group: list[W]) -> list[R]:
        """Write `group` in one statement on `conn`; each item's result, in order."""
        raise NotImplementedError

    async def run_one(self, waiting: W) -> R:
        """Write one item alone (a rejected group is redone this way)."""
        raise NotImplementedError

    async def _drain(self) -> None:
        try:
            while self._waiting:
                group: list[W] = []
                try:
                    async with direct.connect(self.engine) as conn:
                        group = self.take()
                        if not group:
                            return
                        results = await self.run(conn, group)
                except Exception as exc:
                    group = group or self.take()  # no connection: this group fails
                    if isinstance(exc, RETRY_ONE_BY_ONE) and len(group) > 1:
                        await self._one_by_one(group)
                    else:
                        fail(group, exc)
                    continue
                except BaseException as exc:  # cancelled: the gateway is stopping
                    fail(group or self.take(), exc)
                    raise
                for waiting, result in zip(group, results, strict=True):
                    answer(waiting, result)
        finally:
            self._running -= 1

    async def _one_by_one(self, group: list[W]) -> None:
        for waiting in group:
            try:
                result = await self.run_one(waiting)
            except Exception as exc:
                fail([waiting], exc)
            else:
                answer(waiting, result)


def renamed(statement: Any, suffix: str) -> Any:
    """A copy of `statement` whose bound parameters and CTEs are named with `suffix`: copies
    of one statement, renamed apart, can run side by side as one (`pg_finish_group`)."""

    def bind(element: Any) -> None:
        element.key = element.key + suffix

    def cte(element: Any) -> None:
        element.name = element.name + suffix

    return visitors.cloned_traverse(statement, {}, {"bindparam": bind, "cte": cte})


def grouped_statement(copies: Sequence[Any]) -> Any:
    """One statement running `copies` (of one statement, each `renamed` apart) side by side:
    copy i's columns named `…_i`, in copy order, each copy's own FROM items kept."""
    columns: list[Any] = []
    froms: list[Any] = []
    for i, one in enumerate(copies):
        columns += [column.label(f"{column.name}_{i}") for column in one.selected_columns]
        froms += one.get_final_froms()
    return select(*columns).select_from(*froms)


class Grouped(Waiting[Mapping[str, Any]]):
    """One run of a statement of some `kind`: its parameters; its answer, the statement's row."""

    __slots__ = ("kind", "params")

    def __init__(self, params: dict[str, Any], kind: Hashable) -> None:
        super().__init__()
        self.params = params
        self.kind = kind


class KindBatcher(StatementBatcher[Grouped, Mapping[str, Any]]):
    """Runs one-row statements of a few kinds, those of one kind waiting together as one
    `grouped_statement` of 2 or 4 copies (`sizes`), so a connection prepares few shapes.

    `single[kind]`: the statement alone; `grouped[n, kind]`: n copies of it; `columns[kind]`:
    the names of its columns, under which each caller gets its own copy's row.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        single: Mapping[Any, direct.Direct],
        grouped: Mapping[tuple[int, Any], direct.Direct],
        columns: Mapping[Any, Sequence[str]],
        sizes: tuple[int, ...],
        max_statements: int = 4,
    ) -> None:
        super().__init__(engine, max_statements=max_statements)
        self.single = single
        self.grouped = grouped
        self.columns = columns
        self.sizes = sizes

    def take(self) -> list[Grouped]:
        """The longest-waiting run and the others of its kind, as many as a group holds.

        A run whose caller was cancelled meanwhile (the gateway stopping) is left out: it
        writes nothing, as a single statement cancelled before it was sent."""
        self._waiting = [w for w in self._waiting if not w.answer.done()]
        if not self._waiting:
            return []
        kind = self._waiting[0].kind
        alike = [w for w in self._waiting if w.kind == kind]
        size = next((n for n in self.sizes if len(alike) >= n), 1)
        group = alike[:size]
        taken = {id(w) for w in group}
        self._waiting = [w for w in self._waiting if id(w) not in taken]
        return group

    async def run(self, conn: direct.DirectConnection, group: list[Grouped]) -> list[Mapping[str, Any]]:
        """The group's statement; each run's columns under the single statement's names."""
        kind = group[0].kind
        if len(group) == 1:
            return [await self.single[kind].one(conn, group[0].params)]
        params = {f"{name}_{i}": value for i, w in enumerate(group) for name, value in w.params.items()}
        row = await self.grouped[len(group), kind].one(conn, params)
        return [{name: row[f"{name}_{i}"] for name in self.columns[kind]} for i in range(len(group))]

    async def run_one(self, waiting: Grouped) -> Mapping[str, Any]:
        async with direct.connect(self.engine) as conn:
            [row] = await self.run(conn, [waiting])
        return row


def answer(waiting: Waiting[R], result: R) -> None:
    if not waiting.answer.done():
        waiting.answer.set_result(result)


def fail(group: list[W], exc: BaseException) -> None:
    for waiting in group:
        if not waiting.answer.done():
            waiting.answer.set_exception(exc)
