"""Reclaiming a dead replica's sessions: every expired lease with work left, in one statement.

A replica that dies (SIGKILL, a lost machine) leaves its keys' leases held until they
expire. Taking them over one at a time, as the poller finds room for them, made a busy
survivor pick them up one per poll (16.6 s worst wait with a 5 s lease TTL). Instead
each poll frees *all* expired leases of keys with unfinished events at once (owner and
expiry cleared, the fence kept): from then on they are free keys any replica with a run
slot takes at once, and the replica that freed them queues them all for its slots.

Freeing is as safe as a takeover: the old owner's fenced writes need `owner = me AND
fence = mine`, which no longer matches; two replicas freeing at once cannot both match
a row (the second finds the owner already cleared).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import autocommit
from app.db.models import INBOX_UNFINISHED, inbox, one_of, session_keys

_K = session_keys.c
_EXPIRED = (_K.lease_owner.is_not(None), _K.lease_expires_at < bindparam("now"))
_WITH_WORK = (
    select(inbox.c.session_key)
    .join(session_keys, _K.key == inbox.c.session_key)
    .where(one_of(inbox.c.status, INBOX_UNFINISHED), *_EXPIRED)
    .distinct()
    .limit(bindparam("limit"))
)
_FREE_EXPIRED = (
    update(session_keys)
    .where(_K.key.in_(_WITH_WORK.scalar_subquery()), *_EXPIRED)
    .values(lease_owner=None, lease_expires_at=None)
    .returning(_K.key)
)


async def free_expired_leases(engine: AsyncEngine, now: datetime, limit: int) -> list[str]:
    """Free the expired leases of keys with unfinished events (at most `limit`); their keys."""
    async with autocommit(engine).connect() as conn:
        rows = await conn.execute(_FREE_EXPIRED, {"now": now, "limit": limit})
        return sorted(r[0] for r in rows)
