"""The next generation of a session that carries the old one's summaries.

`/compact` and a turn whose window overflows the model's context both close the key's
open session after consolidating it and open a new generation that keeps its title and
chosen model, with the old one's session summaries carried over (so recall still brings
them) and a `compacted_from` link back to it (`/sessions` shows the lineage). Runs under
the key's lease, inside the caller's fenced transaction. A run that was going on when the
generation changed (the overflow) moves with it: its `runs` row names the new generation.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.models import memories, runs, sessions, utcnow
from app.memory.store import Scope, put_memory
from app.sessions.lease import SessionLease
from app.sessions.store import SessionState, SessionStore

CARRIED = ("model",)  # session metadata that a new generation keeps


async def next_generation(
    conn: AsyncConnection,
    store: SessionStore,
    lease: SessionLease,
    old: SessionState,
    channel: str,
    *,
    reason: str = "compact",
    run_id: int | None = None,
) -> tuple[SessionState, int]:
    """Open the key's next generation after `old`; returns it and how many summaries it carries.

    `run_id`: the run that continues in the new generation (its row is moved there)."""
    title = (await conn.execute(select(sessions.c.title).where(sessions.c.id == old.id))).scalar_one()
    summaries = (
        await conn.execute(
            select(memories.c.key, memories.c.content, memories.c.metadata, memories.c.namespace).where(
                memories.c.scope == Scope.SESSION.value,
                memories.c.owner == lease.key,
                memories.c.source_session_id == old.id,
            )
        )
    ).all()
    await store.close_current(conn, lease.key)
    new = await store.open_current(conn, lease.key, channel, fence=lease.fence)
    carried = {k: old.metadata[k] for k in CARRIED if k in old.metadata}
    link: dict[str, Any] = {"session_id": old.id, "generation": old.generation, "reason": reason}
    metadata = {**carried, "compacted_from": link}
    await conn.execute(
        update(sessions)
        .where(sessions.c.id == new.id)
        .values(metadata=metadata, title=title, updated_at=utcnow())
    )
    for row in summaries:
        await put_memory(
            conn,
            Scope.SESSION,
            lease.key,
            row.content,
            key=f"carried:{old.id}:{row.key}",
            kind="summary",
            source_session_id=new.id,
            metadata={**(row.metadata or {}), "from_session_id": old.id},
            namespace=row.namespace,
        )
    if run_id is not None:
        await conn.execute(update(runs).where(runs.c.id == run_id).values(session_id=new.id))
    new = replace(new, metadata=metadata)
    store.remember(lease.key, new, fence=lease.fence)
    return new, len(summaries)
