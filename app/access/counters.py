"""Quota counters in the database: every replica increments and reads the same rows.

One row per (metric, subject) with a fixed window: an increment in a later window starts
the count again; an increment from a clock a little behind adds to the current window
instead of going back. Each increment is one `INSERT … ON CONFLICT DO UPDATE … RETURNING`
(PostgreSQL and SQLite alike), so concurrent increments never lose one another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import case, delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import access_counters as counters
from app.db.upsert import insert_for

MINUTE = 60
DAY = 86_400


def window_of(now: float, length: int) -> int:
    """The start (unix seconds) of the fixed window of `length` seconds holding `now`."""
    return int(now // length) * length


class QuotaCounters:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def add(self, metric: str, amounts: Mapping[str, int], window: int) -> dict[str, int]:
        """Add to each subject's count in `window`; returns the counts after adding."""
        out: dict[str, int] = {}
        if not amounts:
            return out
        async with self.engine.begin() as conn:
            for subject, amount in amounts.items():
                stmt = insert_for(conn.dialect.name, counters).values(
                    metric=metric, subject=subject, window_start=window, count=amount, notified=False
                )
                new, old = stmt.excluded, counters.c
                newer = new.window_start > old.window_start
                stmt = stmt.on_conflict_do_update(
                    index_elements=["metric", "subject"],
                    set_={
                        "count": case((newer, new.count), else_=old.count + new.count),
                        "notified": case((newer, False), else_=old.notified),
                        "window_start": case((newer, new.window_start), else_=old.window_start),
                    },
                ).returning(counters.c.count)
                out[subject] = int((await conn.execute(stmt)).scalar_one())
        return out

    async def read(self, metric: str, subjects: Sequence[str], window: int) -> dict[str, int]:
        """Each subject's count in `window` (0 when it has none there)."""
        if not subjects:
            return {}
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(counters.c.subject, counters.c.count).where(
                    counters.c.metric == metric,
                    counters.c.subject.in_(list(subjects)),
                    counters.c.window_start == window,
                )
            )
            found = {r[0]: int(r[1]) for r in rows}
        return {s: found.get(s, 0) for s in subjects}

    async def claim_notice(self, metric: str, subject: str, window: int) -> bool:
        """True for exactly one caller per subject and window: that one tells the sender."""
        async with self.engine.begin() as conn:
            claimed = await conn.execute(
                update(counters)
                .where(
                    counters.c.metric == metric,
                    counters.c.subject == subject,
                    counters.c.window_start == window,
                    counters.c.notified.is_(False),
                )
                .values(notified=True)
            )
        return bool(claimed.rowcount)

    async def prune(self, before: int) -> int:
        """Drop counters whose window started before `before` (unix seconds)."""
        async with self.engine.begin() as conn:
            gone = await conn.execute(delete(counters).where(counters.c.window_start < before))
        return int(gone.rowcount or 0)
