"""What the preview hub keeps in the database and reads from it.

The stored previews (`stream_previews`: one row per answered event, its platform message
id, and the final answer's id once delivered into it) and the events a turn answers
(`inbox` payloads, a run's `event_ids`). Each call is one autocommit connection.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import RowMapping, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import autocommit
from app.db.models import inbox, runs, stream_previews, utcnow


class PreviewRecords:
    def __init__(self, engine: AsyncEngine) -> None:
        self.single = autocommit(engine)

    async def answered(self, event_id: str | None, run_id: int | None) -> tuple[str | None, Any]:
        """The event a turn answers and its payload: `event_id`, else the run's last event."""
        async with self.single.connect() as conn:
            if event_id is None and run_id is not None:
                ids = (await conn.execute(select(runs.c.event_ids).where(runs.c.id == run_id))).scalar()
                event_id = str(ids[-1]) if ids else None
            if not event_id:
                return event_id, None
            found = await conn.execute(select(inbox.c.payload).where(inbox.c.event_id == event_id))
        return event_id, found.scalar()

    async def payload(self, event_id: str) -> Any:
        async with self.single.connect() as conn:
            return (await conn.execute(select(inbox.c.payload).where(inbox.c.event_id == event_id))).scalar()

    async def run_payload(self, run_id: int, known: str | None) -> Any:
        """The payload of the run's last event, unless that is `known` (then None)."""
        async with self.single.connect() as conn:
            ids = (await conn.execute(select(runs.c.event_ids).where(runs.c.id == run_id))).scalar()
            last = str(ids[-1]) if ids else None
            if last is None or last == known:
                return None
            return (await conn.execute(select(inbox.c.payload).where(inbox.c.event_id == last))).scalar()

    async def preview(self, event_id: str) -> RowMapping | None:
        """The stored preview of `event_id`'s answer, if one was opened."""
        async with self.single.connect() as conn:
            return (
                (await conn.execute(select(stream_previews).where(stream_previews.c.event_id == event_id)))
                .mappings()
                .first()
            )

    async def store(self, event_id: str, channel: str, chat_id: str, preview_id: str) -> str:
        """Store the preview just opened; another replica's stored first wins (its id)."""
        now = utcnow()
        values = dict(
            event_id=event_id,
            channel=channel,
            chat_id=chat_id,
            platform_message_id=preview_id,
            created_at=now,
            updated_at=now,
        )
        try:
            async with self.single.connect() as conn:
                await conn.execute(stream_previews.insert().values(**values))
        except IntegrityError:  # another replica's stream of the same event stored first
            row = await self.preview(event_id)
            return str(row["platform_message_id"]) if row is not None else preview_id
        return preview_id

    async def finished(self, preview_row_id: int, message_id: str) -> None:
        """The final answer `message_id` was delivered into the preview."""
        async with self.single.connect() as conn:
            await conn.execute(
                update(stream_previews)
                .where(stream_previews.c.id == preview_row_id)
                .values(final_message_id=message_id, updated_at=utcnow())
            )

    async def prune(self, older_than_days: float) -> int:
        """Forget previews older than the outbox's retention (0 days: keep); how many."""
        if older_than_days <= 0:
            return 0
        cutoff = utcnow() - timedelta(days=older_than_days)
        async with self.single.connect() as conn:
            result = await conn.execute(delete(stream_previews).where(stream_previews.c.created_at < cutoff))
        return int(result.rowcount or 0)
