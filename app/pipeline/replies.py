"""What a handled event writes back: user messages, replies, outbox rows; and who is told.

Replies go where the event came from, or to the chat a cron fire names (`reply_for`), and
are written to the outbox in the transaction that finishes the event (`Replies.row`). A
channel whose replies are only read (the webhook without a callback) gets them stored as
sent. After the commit, `Replies.handled` wakes the event's waiters and the sender.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy.ext.asyncio import AsyncConnection

from app.channel import WaitResult
from app.db.models import outbox, utcnow
from app.events import InboundEvent, OutboundMessage, Part, TextPart
from app.outbox_rows import outbox_values
from app.pipeline.storage.inbox_queries import MARK
from app.pipeline.storage.port import InboxRow
from app.pipeline.waiters import Waiters
from app.sessions.messages import ChatMessage


def conversation_channel(event: InboundEvent) -> str:
    """The channel of the conversation an event belongs to: where its replies go.

    A cron fire bound to a session carries the session's chat as `reply_target`; a
    generation it opens belongs to that chat's channel (its lifecycle, the dashboard),
    not to `cron`.
    """
    target = event.metadata.get("reply_target") or {}
    return str(target.get("channel") or event.channel)


def reply_for(event: InboundEvent, text: str, media: Sequence[dict[str, Any]] = ()) -> OutboundMessage:
    """The reply to `event`: `text`, then `media` (image and file part dicts) if any."""
    target = event.metadata.get("reply_target") or {}
    return OutboundMessage(
        channel=target.get("channel", event.channel),
        chat_id=target.get("chat_id", event.chat_id),
        thread_id=target.get("thread_id", event.thread_id),
        parts=(TextPart(text=text), *(_PART.validate_python(p) for p in media)),
        # Quoting only makes sense in the chat the event came from.
        reply_to=None if target else event.external_id,
        session_key=event.session_key,
        in_reply_to_event=event.event_id,
        metadata={k: v for k, v in event.metadata.items() if k.startswith("reply_")},
    )


def user_message(event: InboundEvent) -> ChatMessage:
    """The user message an event adds to the history (non-text parts kept as JSON)."""
    others = tuple(p.model_dump(mode="json") for p in event.parts if p.type != "text")
    return ChatMessage(
        role="user", content=event.text, parts=others or None, event_id=event.event_id, name=None
    )


_PART: TypeAdapter[Part] = TypeAdapter(Part)
_INSERT_OUTBOX = outbox.insert()  # built once: the values come with the parameters


class Replies:
    """Outbox rows for replies, and telling the waiters and the sender after the commit."""

    def __init__(
        self,
        waiters: Waiters,
        *,
        delivers: Callable[[str], bool] | None = None,
        on_outbox: Callable[[], None] | None = None,
    ) -> None:
        self.waiters = waiters
        # Whether a channel's replies need sending (`OutboxSender.delivers`); if not, they
        # are stored as sent and the sender is not woken for them.
        self.delivers = delivers or (lambda channel: True)
        self.on_outbox = on_outbox or (lambda: None)

    def row(
        self, message: OutboundMessage, *, session_id: int | None, run_id: int | None, event_id: str | None
    ) -> dict[str, Any]:
        """The reply's outbox row."""
        return outbox_values(
            message,
            session_id=session_id,
            run_id=run_id,
            event_id=event_id,
            sent=not self.delivers(message.channel),
        )

    async def insert(
        self,
        conn: AsyncConnection,
        message: OutboundMessage,
        *,
        session_id: int | None,
        run_id: int | None,
        event_id: str | None,
    ) -> None:
        """Insert the reply's outbox row in the caller's transaction."""
        await conn.execute(
            _INSERT_OUTBOX, self.row(message, session_id=session_id, run_id=run_id, event_id=event_id)
        )

    async def answer(
        self, conn: AsyncConnection, row: InboxRow, text: str, *, session_id: int | None
    ) -> None:
        """Answer `row` with `text` and mark it done, in the caller's fenced transaction."""
        await self.insert(
            conn, reply_for(row.event, text), session_id=session_id, run_id=None, event_id=row.event_id
        )
        await conn.execute(MARK, {"ids": [row.id], "status": "done", "updated_at": utcnow()})

    def handled(
        self, event_ids: Sequence[str], *, result: WaitResult | None = None, outbox: bool = True
    ) -> None:
        """After the commit: wake the events' waiters, and the sender if a reply is to be sent."""
        self.waiters.wake(event_ids, result=result)
        if outbox:
            self.on_outbox()
