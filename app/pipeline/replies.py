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

from app.channel import WaitResult
from app.events import PRIVATE_NOTICE_KEY, InboundEvent, OutboundMessage, Part, TextPart
from app.outbox_rows import outbox_values
from app.pipeline.storage.port import Answer, InboxRow, PipelineStore
from app.pipeline.waiters import Waiters
from app.sessions.lease import SessionLease
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


class Replies:
    """Outbox rows for replies, and telling the waiters and the sender after the commit."""

    def __init__(
        self,
        store: PipelineStore,
        waiters: Waiters,
        *,
        delivers: Callable[[str], bool] | None = None,
        on_outbox: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
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

    def answer_of(
        self,
        row: InboxRow,
        text: str | None,
        *,
        session_id: int | None = None,
        run_id: int | None = None,
        media: Sequence[dict[str, Any]] = (),
        notices: Sequence[OutboundMessage] = (),
        private: bool = False,
    ) -> Answer:
        """`row` answered with `text` (None: done without a reply), and `notices` to other chats.

        `private`: the reply is for the event's sender only (`PRIVATE_NOTICE_KEY`)."""
        replies = [self.row(m, session_id=None, run_id=None, event_id=None) for m in notices]
        if text is not None:
            message = reply_for(row.event, text, media)
            if private:
                message = message.model_copy(
                    update={"metadata": {**message.metadata, PRIVATE_NOTICE_KEY: True}}
                )
            replies.insert(0, self.row(message, session_id=session_id, run_id=run_id, event_id=row.event_id))
        return Answer([row.id], replies)

    async def answer(
        self,
        lease: SessionLease,
        row: InboxRow,
        text: str | None,
        *,
        session_id: int | None = None,
        notices: Sequence[OutboundMessage] = (),
    ) -> None:
        """Answer a command's `row` with `text` (the store's `answer`), then wake who waits."""
        await self.store.answer(lease, self.answer_of(row, text, session_id=session_id, notices=notices))
        self.handled([row.event_id], outbox=text is not None or bool(notices))

    def handled(
        self, event_ids: Sequence[str], *, result: WaitResult | None = None, outbox: bool = True
    ) -> None:
        """After the commit: wake the events' waiters, and the sender if a reply is to be sent."""
        self.waiters.wake(event_ids, result=result)
        if outbox:
            self.on_outbox()
