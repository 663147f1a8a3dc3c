"""Outbound pacing in the database (`PipelineStore.take_pace`, `pause_pace`, `pace_paused`).

Each bucket is a row (`pacing_buckets`) every replica reads and writes: a send takes the
first time all its buckets allow, in one transaction that first makes sure the rows
exist and then locks them in name order (PostgreSQL: `FOR UPDATE`; SQLite: the insert
took the database's write lock), so two replicas never take the same slot; every statement
that locks several of them (a pause, a release) goes in the same order, so they never
deadlock. A bucket spaces sends by its interval (no bursts): at most N sends fall in
any window of N intervals, which is how the platforms state their limits. An exclusive
bucket (a chat) also has one final answer in flight at most (`sending_until`), so the
platform's answer to one send, a `retry_after` above all, is known before the next leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, case, delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.models import pacing_buckets as buckets
from app.db.upsert import insert_for, insert_ignore
from app.pipeline.storage.records import PaceGrant, PaceTake

BUSY_RETRY = 0.05  # seconds: how soon a send refused as `busy` asks again

_SET = (
    update(buckets)
    .where(buckets.c.name == bindparam("name_"))
    .values(
        next_free=bindparam("next_free_"),
        finals_waiting_until=bindparam("waiting_"),
        sending_until=bindparam("sending_"),
    )
)


def _in_name_order(conn: AsyncConnection) -> Any:
    """The order every statement here locks rows in: the names' code points, as Python's
    `sorted` orders them (PostgreSQL's ORDER BY would follow the database's collation, which
    may order them otherwise). SQLite locks the whole database: any order."""
    return buckets.c.name.collate("C") if conn.dialect.name == "postgresql" else buckets.c.name


async def _ensure(conn: AsyncConnection, names: Sequence[str]) -> None:
    await conn.execute(
        insert_ignore(conn, buckets, ["name"]),
        [
            dict(name=n, next_free=0.0, paused_until=0.0, finals_waiting_until=0.0, sending_until=0.0)
            for n in names
        ],
    )


FINAL_RETURN_GRACE = 1.0  # seconds a handed-back answer may take to claim its slot again


async def take(conn: AsyncConnection, request: PaceTake) -> PaceGrant:
    """The slot for one send (see `PaceTake`); run inside a transaction."""
    interval = {b.name: b.interval for b in request.buckets}
    exclusive = {b.name for b in request.buckets if b.exclusive}
    names = sorted(interval)
    now = request.now
    if not names:
        return PaceGrant(True, now)
    await _ensure(conn, names)
    rows = (
        await conn.execute(
            select(buckets).where(buckets.c.name.in_(names)).order_by(_in_name_order(conn)).with_for_update()
        )
    ).all()
    start = max([now, *(r.next_free for r in rows), *(r.paused_until for r in rows)])
    waiting = {r.name: r.finals_waiting_until for r in rows}
    busy = max([0.0, *(r.sending_until for r in rows if r.name in exclusive)])
    if request.preview:
        idle = all(r.next_free + interval[r.name] <= now and r.finals_waiting_until <= now for r in rows)
        if start > now or not idle or busy > now:
            later = max([start, *waiting.values()])
            return PaceGrant(False, later)
    elif start - now > request.within:
        # Not soon: take nothing (the slot stays free for whoever comes first then), but
        # keep previews off these buckets until this answer is back: handed back to the
        # outbox until `start`, it comes back at the sender's next claim, an interval
        # and a grace later at most on a busy machine.
        await conn.execute(
            _SET,
            [
                dict(
                    name_=r.name,
                    next_free_=r.next_free,
                    waiting_=max(r.finals_waiting_until, start + interval[r.name] + FINAL_RETURN_GRACE),
                    sending_=r.sending_until,
                )
                for r in rows
            ],
        )
        return PaceGrant(False, start)
    elif busy > now:
        # A send to this chat is in flight (here or on another replica): its answer first.
        return PaceGrant(False, min(busy, max(start, now + BUSY_RETRY)), busy=True)
    held = start + request.hold if exclusive and request.hold > 0 else 0.0
    taken = [
        dict(
            name_=r.name,
            next_free_=start + interval[r.name],
            waiting_=waiting[r.name],
            sending_=held if r.name in exclusive and held else r.sending_until,
        )
        for r in rows
    ]
    await conn.execute(_SET, taken)
    return PaceGrant(True, start, held_until=held)


async def release(conn: AsyncConnection, names: Sequence[str], held_until: float) -> None:
    """A granted send was answered: its exclusive buckets are free for the next one (only
    where the hold is still its own; a lapsed one may have been taken since)."""
    if not names or not held_until:
        return
    # A row at a time, in name order: one UPDATE of several rows locks them in the order it
    # meets them, and deadlocked with a `take` of another replica locking the same rows.
    await conn.execute(
        update(buckets)
        .where(buckets.c.name == bindparam("name_"), buckets.c.sending_until == held_until)
        .values(sending_until=0.0),
        [{"name_": name} for name in sorted(names)],
    )


async def pause(conn: AsyncConnection, names: Sequence[str], until: float) -> None:
    """No send from these buckets before `until` (a platform's `retry_after`), for every replica."""
    if not names:
        return
    stmt = insert_for(conn.dialect.name, buckets)
    new, old = stmt.excluded.paused_until, buckets.c.paused_until
    later = case((new > old, new), else_=old)
    await conn.execute(
        stmt.on_conflict_do_update(index_elements=["name"], set_={"paused_until": later}),
        [
            dict(name=n, next_free=0.0, paused_until=until, finals_waiting_until=0.0, sending_until=0.0)
            for n in sorted(names)
        ],
    )


async def paused_until(conn: AsyncConnection, names: Sequence[str]) -> float:
    """The latest pause of these buckets (0 when none)."""
    if not names:
        return 0.0
    query = select(buckets.c.paused_until).where(buckets.c.name.in_(list(names)))
    found = (await conn.execute(query)).scalars()
    return max([0.0, *found])


async def prune(conn: AsyncConnection, idle_before: float) -> int:
    """Delete the buckets whose times are all before `idle_before` (one per chat ever sent
    to would pile up); a missing bucket is a fresh one, which such a bucket equals."""
    gone = await conn.execute(
        delete(buckets).where(
            buckets.c.next_free < idle_before,
            buckets.c.paused_until < idle_before,
            buckets.c.finals_waiting_until < idle_before,
            buckets.c.sending_until < idle_before,
        )
    )
    return int(gone.rowcount or 0)
