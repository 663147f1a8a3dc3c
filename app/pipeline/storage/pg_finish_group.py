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
from functools import partial
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import direct
from app.pipeline.storage.pg_batcher import Grouped, KindBatcher, grouped_statement, renamed
from app.pipeline.storage.pg_turn import FINISH, finish_statement

# How many turns a group statement ends (largest first); fewer waiting: a single end.
SIZES = (4, 2)
_KINDS = (False, True)  # whether the ends hand the run slot on


def _grouped(turns: int, hand_on: bool) -> Any:
    """`turns` copies of the end's statement in one: turn i's parameters and columns end in `_i`."""
    return grouped_statement([renamed(finish_statement(hand_on=hand_on), f"_{i}") for i in range(turns)])


# Built when a group of that size and kind first ends (`direct.Direct`'s `build`).
_GROUPED = {
    (n, hand_on): direct.Direct(build=partial(_grouped, n, hand_on)) for n in SIZES for hand_on in _KINDS
}
# The columns of one turn's end, by kind.
_COLUMNS = {kind: [c.name for c in cast(Any, FINISH[kind].statement).selected_columns] for kind in _KINDS}


class FinishGroup(KindBatcher):
    """Ends turns, those arriving together in one statement (see the module).

    `max_statements`: statements in flight at once (each holds a connection).
    """

    def __init__(self, engine: AsyncEngine, *, max_statements: int = 4) -> None:
        super().__init__(
            engine,
            single=FINISH,
            grouped=_GROUPED,
            columns=_COLUMNS,
            sizes=SIZES,
            max_statements=max_statements,
        )

    async def finish(self, params: dict[str, Any], *, hand_on: bool) -> Mapping[str, Any]:
        """Run `pg_turn.FINISH[hand_on]` with `params`, perhaps with other turns' ends."""
        return await self.submit(Grouped(params, hand_on))
