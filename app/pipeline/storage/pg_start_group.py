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
from functools import partial
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import direct
from app.pipeline.storage.pg_batcher import Grouped, KindBatcher, grouped_statement, renamed
from app.pipeline.storage.pg_start import START, start_statement

# How many turns a group statement starts (largest first); fewer waiting: a single start.
SIZES = (4, 2)
_KINDS = (None, False, True)  # the memory-recall variant: none, without or with the user scope


def _grouped(turns: int, recall: bool | None) -> Any:
    """`turns` copies of the start's statement in one: turn i's parameters and columns end in `_i`."""
    return grouped_statement(
        [renamed(start_statement(recall, one=f"one_{i}"), f"_{i}") for i in range(turns)]
    )


# Built when a group of that size and kind first starts (`direct.Direct`'s `build`).
_GROUPED = {
    (n, recall): direct.Direct(build=partial(_grouped, n, recall)) for n in SIZES for recall in _KINDS
}
# The columns of one turn's start, by kind.
_COLUMNS = {kind: [c.name for c in cast(Any, START[kind].statement).selected_columns] for kind in _KINDS}


class StartGroup(KindBatcher):
    """Starts turns, those arriving together in one statement (see the module).

    `max_statements`: statements in flight at once (each holds a connection).
    """

    def __init__(self, engine: AsyncEngine, *, max_statements: int = 4) -> None:
        super().__init__(
            engine,
            single=START,
            grouped=_GROUPED,
            columns=_COLUMNS,
            sizes=SIZES,
            max_statements=max_statements,
        )

    async def start(self, params: dict[str, Any], *, recall: bool | None) -> Mapping[str, Any]:
        """Run `pg_start.START[recall]` with `params`, perhaps with other turns' starts."""
        return await self.submit(Grouped(params, recall))
