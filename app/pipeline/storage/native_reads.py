"""The reads platform-native events need (`app.pipeline.platform_events`), on the port.

An edit, recall or reaction names a message by the platform's id (`MESSAGE_REF_KEY` of
the event that brought it, the `platform_message_id` of a reply we sent); these find the
inbox event and the replies it is about. One statement each, no transaction of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox, outbox
from app.events import MESSAGE_REF_KEY, NATIVE_KEY, InboundEvent, OutboundMessage

# How far back an edit or recall may reach: the key's newest inbox rows.
REF_WINDOW = 500


@dataclass(frozen=True)
class RefEvent:
    """An accepted event found by the platform's id of its message, and how far it got."""

    row_id: int
    event_id: str
    status: str  # pending | processing | done | failed
    event: InboundEvent

    @property
    def waiting(self) -> bool:
        """Not handled yet (queued, or a turn that has not committed its start)."""
        return self.status in ("pending", "processing")


@dataclass(frozen=True)
class SentReply:
    """A reply of ours the platform holds (its id there), and where it went."""

    platform_message_id: str
    message: OutboundMessage


class NativeReads:
    reader: AsyncEngine

    async def inbox_by_ref(self, key: str, refs: Sequence[str]) -> dict[str, RefEvent]:
        """The key's newest events carrying these platform message ids, by id."""
        wanted: set[str] = set(refs)
        found: dict[str, RefEvent] = {}
        if not wanted:
            return {}
        statement = (
            select(inbox.c.id, inbox.c.event_id, inbox.c.status, inbox.c.payload)
            .where(inbox.c.session_key == key)
            .order_by(inbox.c.id.desc())
            .limit(REF_WINDOW)
        )
        async with self.reader.connect() as conn:
            rows = (await conn.execute(statement)).mappings().all()
        for row in rows:
            metadata = (row["payload"] or {}).get("metadata") or {}
            ref = metadata.get(MESSAGE_REF_KEY)
            if ref is None or str(ref) not in wanted or str(ref) in found or NATIVE_KEY in metadata:
                continue
            try:
                event = InboundEvent.model_validate(row["payload"])
            except ValueError:
                continue
            found[str(ref)] = RefEvent(row["id"], row["event_id"], row["status"], event)
        return found

    async def sent_replies(self, event_id: str) -> list[SentReply]:
        """The replies to `event_id` that reached the platform, oldest first."""
        statement = (
            select(outbox.c.platform_message_id, outbox.c.payload)
            .where(outbox.c.event_id == event_id, outbox.c.platform_message_id.is_not(None))
            .order_by(outbox.c.id)
        )
        async with self.reader.connect() as conn:
            rows = (await conn.execute(statement)).all()
        return [
            SentReply(str(r.platform_message_id), OutboundMessage.model_validate(r.payload)) for r in rows
        ]

    async def reply_by_platform_id(self, key: str, platform_message_id: str) -> OutboundMessage | None:
        """The reply of ours in session `key` the platform knows as `platform_message_id`."""
        statement = (
            select(outbox.c.payload)
            .where(outbox.c.session_key == key, outbox.c.platform_message_id == platform_message_id)
            .order_by(outbox.c.id.desc())
            .limit(1)
        )
        async with self.reader.connect() as conn:
            payload = (await conn.execute(statement)).scalar()
        return OutboundMessage.model_validate(payload) if payload else None
