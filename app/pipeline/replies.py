"""What a turn reads out of an event and writes back: commands, replies, outbox rows.

A message whose text starts with one of the session commands (`/new`, `/reset`, `/end`)
or run commands (`/stop`, `/approve`, `/deny`) is handled by `app.pipeline.turn` instead
of going to the model. Everything else becomes a user message (`user_message`). Replies
go where the event came from, or to the chat a cron fire names (`reply_target`), and are
written to the outbox in the transaction that finishes the turn (`outbox_values`,
`insert_outbox_row`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from app.db.models import outbox, utcnow
from app.events import InboundEvent, OutboundMessage, TextPart
from app.sessions.messages import ChatMessage

SESSION_COMMANDS = {
    "/new": "Started a new conversation.",
    "/reset": "The conversation was reset. Earlier messages are kept but no longer used.",
    "/end": "Conversation ended. Send a message to start a new one.",
}
RUN_COMMANDS = ("/stop", "/approve", "/deny")


def command_of(event: InboundEvent) -> str:
    text = event.text.strip()
    return text.split(maxsplit=1)[0].lower() if text else ""


def is_command(event: InboundEvent) -> bool:
    command = command_of(event)
    return command in SESSION_COMMANDS or command in RUN_COMMANDS


def conversation_channel(event: InboundEvent) -> str:
    """The channel of the conversation an event belongs to: where its replies go.

    A cron fire bound to a session carries the session's chat as `reply_target`; a
    generation it opens belongs to that chat's channel (its lifecycle, the dashboard),
    not to `cron`.
    """
    target = event.metadata.get("reply_target") or {}
    return str(target.get("channel") or event.channel)


def reply_for(event: InboundEvent, text: str) -> OutboundMessage:
    target = event.metadata.get("reply_target") or {}
    return OutboundMessage(
        channel=target.get("channel", event.channel),
        chat_id=target.get("chat_id", event.chat_id),
        thread_id=target.get("thread_id", event.thread_id),
        parts=(TextPart(text=text),),
        # Quoting only makes sense in the chat the event came from.
        reply_to=None if target else event.external_id,
        session_key=event.session_key,
        in_reply_to_event=event.event_id,
        metadata={k: v for k, v in event.metadata.items() if k.startswith("reply_")},
    )


_INSERT_OUTBOX = outbox.insert()  # built once: the values come with the parameters


async def insert_outbox_row(conn: AsyncConnection, values: dict[str, Any]) -> None:
    """Insert an outbox row made by `outbox_values`."""
    await conn.execute(_INSERT_OUTBOX, values)


def outbox_values(
    message: OutboundMessage,
    *,
    session_id: int | None,
    run_id: int | None,
    event_id: str | None,
    now: datetime | None = None,
    sent: bool = False,
) -> dict[str, Any]:
    """An outbox row; `sent`: its channel has nothing to send (`app.channel.delivers`)."""
    now = now or utcnow()
    return dict(
        message_id=message.message_id,
        session_key=message.session_key or "",
        session_id=session_id,
        run_id=run_id,
        event_id=event_id,
        channel=message.channel,
        chat_id=message.chat_id,
        payload=message.model_dump(mode="json"),
        status="sent" if sent else "pending",
        attempts=0,
        next_attempt_at=now,
        created_at=now,
        sent_at=now if sent else None,
    )


def user_message(event: InboundEvent) -> ChatMessage:
    """The user message an event adds to the history (non-text parts kept as JSON)."""
    others = tuple(p.model_dump(mode="json") for p in event.parts if p.type != "text")
    return ChatMessage(
        role="user",
        content=event.text,
        parts=others or None,
        event_id=event.event_id,
        name=None,
    )
