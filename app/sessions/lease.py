"""Fenced per-key leases in the database: one worker per session key, across processes.

Taking a lease increments the key's fence. Every write a worker makes for the key runs
`check_fence` first, in the same transaction: an `UPDATE … WHERE owner = me AND fence =
mine` that also row-locks the key on PostgreSQL, so a takeover either happened before
(and the write fails with `LeaseLost`) or waits until the write committed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db import direct
from app.db.direct import Direct
from app.db.engine import autocommit, lax_commit
from app.db.models import INBOX_UNFINISHED, inbox, one_of, session_keys, utcnow
from app.db.upsert import insert_for, insert_ignore
from app.errors import LeaseLost


@dataclass(frozen=True)
class SessionLease:
    key: str
    owner: str
    fence: int
    took_over: bool = False  # taken from another owner whose lease had expired


# The statements are built once (bound parameters only): they run several times per turn.
_K = session_keys.c
MINE = and_(_K.key == bindparam("k"), _K.lease_owner == bindparam("o"), _K.lease_fence == bindparam("f"))


def _lax(dialect_name: str) -> list[Any]:
    """Taking or giving up a lease commits without waiting for the disk (`lax_commit`)."""
    return [lax_commit()] if dialect_name == "postgresql" else []


def take_free_or_new(dialect_name: str, *, ours: bool = True) -> Any:
    """Create the key's row holding our lease, or take the existing row's free lease: one statement.

    `ours`: a lease held by this owner already is taken too (a new fence); without it, only
    a free one (another worker of this owner holds it, and a new fence would fence it out).
    Without RETURNING: `app.pipeline.storage.pg_inbox` reads more in the same statement.
    """
    owner: Any = bindparam("o")
    expires: Any = bindparam("exp")
    free = _K.lease_owner.is_(None)
    return (
        insert_for(dialect_name, session_keys)
        .values(key=bindparam("k"), lease_owner=owner, lease_fence=1, lease_expires_at=expires)
        .on_conflict_do_update(
            index_elements=["key"],
            set_={"lease_owner": owner, "lease_fence": _K.lease_fence + 1, "lease_expires_at": expires},
            where=or_(free, _K.lease_owner == owner) if ours else free,
        )
    )


_TAKE = {
    name: Direct(take_free_or_new(name).returning(_K.lease_fence, *_lax(name)))
    for name in ("postgresql", "sqlite")
}
TAKE_EXPIRED = (
    update(session_keys)
    .where(_K.key == bindparam("k"), _K.lease_owner != bindparam("o"), _K.lease_expires_at < bindparam("now"))
    .values(lease_owner=bindparam("o"), lease_fence=_K.lease_fence + 1, lease_expires_at=bindparam("exp"))
    .returning(_K.lease_fence)
)
_RENEW = update(session_keys).where(MINE).values(lease_expires_at=bindparam("exp"))
_UNFINISHED = (
    select(inbox.c.id)
    .where(inbox.c.session_key == bindparam("k"), one_of(inbox.c.status, INBOX_UNFINISHED))
    .limit(1)
    .exists()
)
LET_GO = update(session_keys).where(MINE).values(lease_owner=None, lease_expires_at=None)
RELEASE = {
    name: Direct(LET_GO.returning(_UNFINISHED.label("unfinished"), *_lax(name)))
    for name in ("postgresql", "sqlite")
}
ASK_UNFINISHED = select(_UNFINISHED)
CHECK = update(session_keys).where(MINE).values(lease_fence=_K.lease_fence)


async def ensure_key(conn: AsyncConnection, key: str) -> None:
    await conn.execute(insert_ignore(conn, session_keys, ["key"]).values(key=key, lease_fence=0))


async def acquire(
    engine: AsyncEngine, key: str, owner: str, ttl: float, *, now: datetime | None = None
) -> SessionLease | None:
    """Take the key's lease if it is free, expired or already ours; None if held.

    Taking a free lease is one statement, whether the key's row exists or is created by
    it (an upsert); taking an expired lease over (`took_over`) is the slower path.
    """
    lease, _ = await acquire_reading(engine, key, owner, ttl, now=now)
    return lease


async def acquire_reading(
    engine: AsyncEngine,
    key: str,
    owner: str,
    ttl: float,
    *,
    take: Direct | None = None,
    now: datetime | None = None,
) -> tuple[SessionLease | None, Any]:
    """`acquire`, also returning the row of the statement that took a free lease (else None).

    `take` replaces that statement: `take_free_or_new` returning `lease_fence` and whatever
    else it reads in the same statement (`app.pipeline.storage.pg_inbox`).
    """
    now = now or utcnow()
    params = {"k": key, "o": owner, "exp": now + timedelta(seconds=ttl), "now": now}
    # Each statement is atomic on its own: no transaction around them (no BEGIN/COMMIT).
    single = autocommit(engine)
    async with direct.connect(single) as conn:
        statement = take or _TAKE[conn.dialect.name]
        taken = await statement.first(conn, params)
    if taken is not None:
        return SessionLease(key, owner, taken["lease_fence"]), taken
    async with single.connect() as own:
        fence = (await own.execute(TAKE_EXPIRED, params)).scalar()
    return (SessionLease(key, owner, fence, took_over=True) if fence is not None else None), None


def mine(lease: SessionLease) -> dict[str, Any]:
    """The parameters `k`, `o`, `f` of the statements fenced by `lease` (`MINE`)."""
    return {"k": lease.key, "o": lease.owner, "f": lease.fence}


async def renew(engine: AsyncEngine, lease: SessionLease, ttl: float) -> bool:
    async with autocommit(engine).connect() as conn:
        result = await conn.execute(_RENEW, {**mine(lease), "exp": utcnow() + timedelta(seconds=ttl)})
    return result.rowcount == 1


async def release(engine: AsyncEngine, lease: SessionLease) -> bool:
    """Give the lease up; returns whether the key still has unfinished inbox events.

    The check is part of the releasing statement: an event accepted by another replica
    while we held the lease (its worker found the key taken and left it to us) is seen
    here, or its worker's next attempt finds the lease free.
    """
    single = autocommit(engine)
    async with direct.connect(single) as conn:
        released = await RELEASE[conn.dialect.name].first(conn, mine(lease))
    if released is not None:
        return bool(released["unfinished"])
    # No longer ours: ask separately.
    async with single.connect() as own:
        row = (await own.execute(ASK_UNFINISHED, {"k": lease.key})).first()
    return bool(row is not None and row[0])


async def check_fence(conn: AsyncConnection, lease: SessionLease) -> None:
    """Raise `LeaseLost` unless `lease` is still the key's current lease (same tx as the write)."""
    result = await conn.execute(CHECK, mine(lease))
    if result.rowcount != 1:
        raise LeaseLost(lease.key, lease.fence)
