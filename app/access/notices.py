"""A reply to an event that is not stored: written straight to the outbox.

The pairing code and the over-quota notice go out like every reply (the outbox sender
delivers them, with its retries), but no inbox row, session or history is made for the
event that caused them.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import outbox
from app.events import InboundEvent, OutboundMessage, TextPart
from app.outbox_rows import outbox_values


class Notices:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        delivers: Callable[[str], bool] | None = None,
        on_outbox: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.delivers = delivers or (lambda channel: True)
        self.on_outbox = on_outbox or (lambda: None)

    async def send(self, event: InboundEvent, text: str) -> None:
        message = OutboundMessage(
            channel=event.channel,
            chat_id=event.chat_id,
            thread_id=event.thread_id,
            parts=(TextPart(text=text),),
            reply_to=event.external_id,
            session_key=event.session_key,
            in_reply_to_event=event.event_id,
            metadata={k: v for k, v in event.metadata.items() if k.startswith("reply_")},
        )
        # A channel whose replies are only read gets it stored as sent (`app.channel.delivers`).
        sent = not self.delivers(event.channel)
        row = outbox_values(message, session_id=None, run_id=None, event_id=event.event_id, sent=sent)
        async with self.engine.begin() as conn:
            await conn.execute(outbox.insert(), row)
        if not sent:
            self.on_outbox()
