"""A channel's read-only view of its stored events: status, replies, pending approvals.

Channels whose callers ask about progress later (A2A's `tasks/get`) derive what they
report from the inbox, outbox and approvals rows, so nothing of it is kept in memory and
it survives a restart. Every read is scoped to one channel: an adapter never sees
another channel's events. The one write, `cancel_pending`, cancels an event no turn has
taken yet: the handling skips a canceled row (`PipelineStore.count_attempt`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.channel import EventStatus, Reply
from app.db.models import CANCELED, approvals, inbox, outbox, runs, utcnow


def _text_of(payload: dict[str, Any]) -> str:
    parts = payload.get("parts", [])
    return "\n".join(p.get("text", "") for p in parts if p.get("type") == "text")


async def stored_as(engine: AsyncEngine, channel: str, external_id: str) -> tuple[str, str] | None:
    """The (event id, session key) an event of `channel` with this platform id was stored
    under, if any: ingest answers a redelivery as a duplicate before any quota counts it."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(inbox.c.event_id, inbox.c.session_key).where(
                    inbox.c.channel == channel, inbox.c.external_id == external_id
                )
            )
        ).first()
    return None if row is None else (row.event_id, row.session_key)


class ChannelEvents:
    def __init__(self, engine: AsyncEngine, channel: str) -> None:
        self.engine = engine
        self.channel = channel

    async def status(self, event_id: str) -> EventStatus | None:
        async with self.engine.connect() as conn:
            row = (
                (
                    await conn.execute(
                        select(inbox).where(inbox.c.event_id == event_id, inbox.c.channel == self.channel)
                    )
                )
                .mappings()
                .first()
            )
            if row is None:
                return None
            replies = (
                await conn.execute(
                    select(outbox.c.message_id, outbox.c.payload, outbox.c.status)
                    .where(outbox.c.event_id == event_id)
                    .order_by(outbox.c.id)
                )
            ).all()
            waiting = (
                await conn.execute(
                    select(func.count())
                    .select_from(approvals)
                    .where(
                        approvals.c.session_key == row["session_key"],
                        approvals.c.status == "pending",
                        # the event's own turn asked (its run), not a later one
                        approvals.c.run_id == row["run_id"],
                    )
                )
            ).scalar_one()
            tokens = (
                (
                    await conn.execute(
                        select(runs.c.prompt_tokens, runs.c.completion_tokens).where(
                            runs.c.id == row["run_id"]
                        )
                    )
                ).first()
                if row["run_id"] is not None
                else None
            )
        payload = row["payload"] or {}
        return EventStatus(
            event_id=row["event_id"],
            channel=row["channel"],
            session_key=row["session_key"],
            status=row["status"],
            attempts=row["attempts"],
            error=row["error"],
            metadata=dict(payload.get("metadata") or {}),
            text=_text_of(payload),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            awaiting_approval=bool(waiting) and row["status"] == "done",
            replies=[
                Reply(message_id=mid, text=_text_of(p or {}), parts=(p or {}).get("parts", []), status=st)
                for mid, p, st in replies
            ],
            prompt_tokens=int(tokens[0] or 0) if tokens else 0,
            completion_tokens=int(tokens[1] or 0) if tokens else 0,
        )

    async def find(self, external_id: str) -> str | None:
        async with self.engine.connect() as conn:
            found = (
                await conn.execute(
                    select(inbox.c.event_id).where(
                        inbox.c.channel == self.channel, inbox.c.external_id == external_id
                    )
                )
            ).scalar_one_or_none()
        return found

    async def list_ids(
        self,
        key_prefix: str,
        *,
        external_prefix: str = "",
        limit: int = 50,
        before: int | None = None,
        updated_after: datetime | None = None,
    ) -> list[tuple[int, str, str]]:
        """(row id, event id, session key) of this channel's events whose session key starts with
        `key_prefix` (and platform id with `external_prefix`), newest first, below the row
        id `before`: a page of a listing (A2A's `ListTasks`)."""
        query = (
            select(inbox.c.id, inbox.c.event_id, inbox.c.session_key)
            .where(inbox.c.channel == self.channel)
            .where(inbox.c.session_key.startswith(key_prefix, autoescape=True))
            .where(inbox.c.external_id.startswith(external_prefix, autoescape=True))
            .order_by(inbox.c.id.desc())
            .limit(limit)
        )
        if before is not None:
            query = query.where(inbox.c.id < before)
        if updated_after is not None:
            query = query.where(inbox.c.updated_at > updated_after)
        async with self.engine.connect() as conn:
            return [(int(r[0]), str(r[1]), str(r[2])) for r in await conn.execute(query)]

    async def count(self, session_key: str) -> int:
        async with self.engine.connect() as conn:
            n = (
                await conn.execute(
                    select(func.count())
                    .select_from(inbox)
                    .where(inbox.c.session_key == session_key, inbox.c.channel == self.channel)
                )
            ).scalar_one()
        return int(n)

    async def cancel_pending(self, event_id: str) -> bool:
        async with self.engine.begin() as conn:
            canceled = await conn.execute(
                update(inbox)
                .where(
                    inbox.c.event_id == event_id,
                    inbox.c.channel == self.channel,
                    inbox.c.status == "pending",
                )
                .values(status=CANCELED, updated_at=utcnow())
            )
        return bool(canceled.rowcount)
