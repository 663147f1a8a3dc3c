"""Small records a channel keeps for itself, and messages it hands the outbox itself.

A channel sees no database (`app.channel`); some still need a little durable state of
their own that every replica reads the same, and to send something that is no reply to
a turn. A2A push notifications are both: the callers' push configs are records
(`kind` "push"), and each notification is an outbox row the sender delivers with its
retries and backoff (`deliver`), deduplicated on the message id so that replicas that
notice the same change at once send it once.

Every record is scoped to one channel, as `app.event_reader` is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.channel import ChannelRecord
from app.db.models import channel_records, outbox, utcnow
from app.db.upsert import insert_ignore
from app.events import OutboundMessage, stored_json


def _record(row: Any) -> ChannelRecord:
    return ChannelRecord(key=row.key, owner=row.owner, data=dict(row.data or {}), open=bool(row.open))


class ChannelRecords:
    """`app.channel.RecordStore` in the `channel_records` and `outbox` tables."""

    def __init__(
        self, engine: AsyncEngine, channel: str, on_outbox: Callable[[], None] | None = None
    ) -> None:
        self.engine = engine
        self.channel = channel
        self.on_outbox = on_outbox or (lambda: None)

    def _of(self, kind: str) -> Any:
        return (channel_records.c.channel == self.channel, channel_records.c.kind == kind)

    async def put(
        self, kind: str, key: str, data: dict[str, Any], *, owner: str | None = None, open: bool = True
    ) -> None:
        """Store the record (replacing the one with that key)."""
        now = utcnow()
        async with self.engine.begin() as conn:
            changed = await conn.execute(
                update(channel_records)
                .where(*self._of(kind), channel_records.c.key == key)
                .values(owner=owner, data=data, open=open, updated_at=now)
            )
            if not changed.rowcount:
                await conn.execute(
                    insert_ignore(conn, channel_records, ["channel", "kind", "key"]),
                    dict(
                        channel=self.channel,
                        kind=kind,
                        key=key,
                        owner=owner,
                        data=data,
                        open=open,
                        created_at=now,
                        updated_at=now,
                    ),
                )

    async def get(self, kind: str, key: str) -> ChannelRecord | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(channel_records).where(*self._of(kind), channel_records.c.key == key)
                )
            ).first()
        return None if row is None else _record(row)

    async def with_prefix(self, kind: str, prefix: str, limit: int = 100) -> list[ChannelRecord]:
        """Records whose key starts with `prefix` (taken literally), oldest first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(channel_records)
                .where(*self._of(kind), channel_records.c.key.startswith(prefix, autoescape=True))
                .order_by(channel_records.c.created_at, channel_records.c.key)
                .limit(limit)
            )
            return [_record(r) for r in rows]

    async def open_records(self, kind: str, limit: int = 500) -> list[ChannelRecord]:
        """Records still marked open, oldest first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(channel_records)
                .where(*self._of(kind), channel_records.c.open.is_(True))
                .order_by(channel_records.c.updated_at)
                .limit(limit)
            )
            return [_record(r) for r in rows]

    async def remove(self, kind: str, key: str) -> bool:
        async with self.engine.begin() as conn:
            gone = await conn.execute(
                delete(channel_records).where(*self._of(kind), channel_records.c.key == key)
            )
        return bool(gone.rowcount)

    async def deliver(self, messages: Sequence[OutboundMessage]) -> None:
        """Hand messages of this channel to the outbox (once per message id); the sender
        delivers them through the channel's `send`, with its retries and backoff."""
        if not messages:
            return
        now = utcnow()
        rows = [
            dict(
                message_id=m.message_id,
                session_key=m.session_key or f"{self.channel}:{m.chat_id}",
                event_id=None,
                channel=self.channel,
                chat_id=m.chat_id,
                payload=stored_json(m),
                status="pending",
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
            for m in messages
            if m.channel == self.channel
        ]
        async with self.engine.begin() as conn:
            await conn.execute(insert_ignore(conn, outbox, ["message_id"]), rows)
        self.on_outbox()

    async def delivery_failed(self, platform_message_id: str, error: str) -> bool:
        """Mark this channel's sent outbox row of `platform_message_id` failed, with the
        platform's reason: a dead letter the operator sees, may retry or discard."""
        async with self.engine.begin() as conn:
            changed = await conn.execute(
                update(outbox)
                .where(
                    outbox.c.channel == self.channel,
                    outbox.c.platform_message_id == platform_message_id,
                    outbox.c.status == "sent",
                )
                .values(status="failed", last_error=error)
            )
        return bool(changed.rowcount)
