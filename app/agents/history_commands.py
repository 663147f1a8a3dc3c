"""The commands that change what the bot remembers of a session: /undo /retry /compact.

Nothing is deleted: /undo and /retry mark the last exchange hidden on the session row
(`app.sessions.history_marks`), /retry then answers the message again, and /compact folds
the conversation into summaries and continues in a new generation linked to the old one.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.db.models import utcnow
from app.events import InboundEvent
from app.memory.consolidation import Consolidator
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies, conversation_channel
from app.pipeline.storage.port import Answer, PipelineStore
from app.pipeline.texts import say
from app.pipeline.turn import TurnRunner
from app.pipeline.turn_state import Handled
from app.sessions.history_marks import last_turn, mark
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState


class HistoryCommands:
    def __init__(
        self,
        store: PipelineStore,
        replies: Replies,
        turns: TurnRunner,
        consolidator: Consolidator | None = None,
    ) -> None:
        self.store = store
        self.replies = replies
        self.turns = turns  # /retry runs a turn
        self.consolidator = consolidator  # /compact folds with it

    def commands(self) -> list[Command]:
        return [
            Command(
                "/undo",
                {
                    "en": "Take back the last exchange (it stays in the history, the bot forgets it).",
                    "zh": "撤回上一轮对话（历史中保留，但机器人不再参考）。",
                },
                self.undo,
            ),
            Command(
                "/retry",
                {
                    "en": "Answer your last message again (the old answer is kept, marked superseded).",
                    "zh": "重新回答你的上一条消息（旧回答保留并标记为已取代）。",
                },
                self.retry,
            ),
            Command(
                "/compact",
                {
                    "en": "Summarize this conversation and continue in a fresh one that keeps the summary.",
                    "zh": "总结当前对话，并在保留摘要的新对话中继续。",
                },
                self.compact,
            ),
        ]

    async def _last_turn(self, call: CommandCall) -> tuple[SessionState, ChatMessage, int] | None:
        session = (await self.store.open_session(call.lease, conversation_channel(call.event))).session
        found = last_turn(await self.store.sessions.all_messages(session.id), session.metadata)
        return None if found is None else (session, *found)

    async def undo(self, call: CommandCall) -> None:
        found = await self._last_turn(call)
        if found is None:
            await self.replies.answer(call.lease, call.row, say("undo.nothing", call.locale))
            return
        _, user, end = found
        by, at = call.event.sender_id, utcnow()

        def undone(metadata: dict[str, Any]) -> dict[str, Any]:
            return mark(metadata, user.seq or 0, end, why="undone", by=by, at=at)

        answer = self.replies.answer_of(call.row, say("undo.done", call.locale))
        await self.store.set_session_metadata(
            call.lease, conversation_channel(call.event), undone, answer=answer
        )
        self.replies.handled([call.row.event_id])

    async def retry(self, call: CommandCall) -> Handled | None:
        found = await self._last_turn(call)
        if found is None:
            await self.replies.answer(call.lease, call.row, say("retry.nothing", call.locale))
            return None
        _, user, end = found
        by, at = call.event.sender_id, utcnow()

        def superseded(metadata: dict[str, Any]) -> dict[str, Any]:
            return mark(metadata, user.seq or 0, end, why="superseded", by=by, at=at)

        await self.store.set_session_metadata(call.lease, conversation_channel(call.event), superseded)
        # The retried message is appended again (history stays append-only) and answered.
        parts = [{"type": "text", "text": user.content or ""}, *(user.parts or ())]
        again = InboundEvent.model_validate({**call.event.model_dump(), "parts": parts})
        return await self.turns.run(call.lease, [replace(call.row, event=again)], None)

    async def compact(self, call: CommandCall) -> None:
        """Consolidate now (thresholds ignored), then continue in a new generation that
        carries the old one's summaries, its title and model, linked to it."""
        if self.consolidator is None:
            await self.replies.answer(call.lease, call.row, say("compact.unavailable", call.locale))
            return
        lease, channel = call.lease, conversation_channel(call.event)
        old = (await self.store.open_session(lease, channel)).session
        if old.message_count == 0:
            await self.replies.answer(lease, call.row, say("compact.nothing", call.locale), session_id=old.id)
            return
        await self.consolidator.consolidate(lease, old.id, force=True)

        def done(new: SessionState, carried: int) -> Answer:
            text = say("compact.done", call.locale, old=old.generation, new=new.generation, summaries=carried)
            return self.replies.answer_of(call.row, text, session_id=new.id)

        await self.store.next_generation(lease, old, channel, reason="compact", answer=done)
        self.replies.handled([call.row.event_id])
