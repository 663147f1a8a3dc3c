"""What a turn sends the model: which model serves it, and which part of its history.

The model: `app.sessions.profiles.SessionModels` decides it (`/model`'s choice, else the
serving agent's, else the channel's). The window: the session's newest messages after
`last_consolidated`, cut to a legal suffix within the limits, without the turns `/undo`
and `/retry` (or a recall) marked hidden, with the notes platform events left
(`app.sessions.history_notes`).
While a run works, its session stays active (`app.sessions.heartbeat`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

from sqlalchemy.ext.asyncio import AsyncEngine

from app.events import InboundEvent
from app.pipeline.storage.port import PipelineStore
from app.pipeline.turn_state import TurnState, WindowLimits
from app.sessions.heartbeat import Heartbeats
from app.sessions.history_marks import hidden_ranges, visible
from app.sessions.history_notes import with_notes
from app.sessions.messages import ChatMessage
from app.sessions.profiles import SessionModels
from app.sessions.store import SessionState, message_from_row, message_values
from app.sessions.window import trim_to_legal_window


class TurnWindow:
    def __init__(
        self,
        store: PipelineStore,
        limits: WindowLimits,
        models: SessionModels,
        *,
        heartbeat_engine: AsyncEngine | None = None,
        heartbeat_seconds: float = 0.0,
    ) -> None:
        self.store = store
        self.limits = limits
        self.models = models
        # Refresh last_active_at while a run works (0 seconds: off).
        self.heartbeats = Heartbeats(heartbeat_engine, heartbeat_seconds)

    def model(self, session: SessionState, event: InboundEvent) -> str | None:
        """The model the turn asks for (None: the provider's default)."""
        return self.models.of(session, event)

    def beat(self, session_id: int) -> AbstractAsyncContextManager[None]:
        """A long run keeps its session active while it works."""
        return self.heartbeats.working(session_id)

    async def load(self, turn: TurnState) -> list[ChatMessage]:
        """The turn's window as the model should see it now."""
        limits = self.limits
        # Turns marked undone/superseded (/undo, /retry) stay stored but are not sent.
        marks = turn.session.metadata
        if turn.stored is not None:  # what `SessionStore.load_window` would read now
            window = trim_to_legal_window(
                visible(turn.stored, marks),
                max_messages=limits.max_messages,
                max_tokens=limits.max_tokens,
            )
        else:
            window = await self.store.sessions.load_window(
                turn.session, max_messages=limits.max_messages, max_tokens=limits.max_tokens
            )
            if hidden_ranges(marks):
                window = trim_to_legal_window(visible(window, marks))
        # What happened on the platform between turns (an edit, a reaction): notes.
        return with_notes(window, marks)

    def keep(self, turn: TurnState, new: Sequence[ChatMessage], seqs: Sequence[int]) -> None:
        """Keep `turn.stored` as a read would return it after `new` was appended."""
        if turn.stored is None:
            return
        turn.stored.extend(
            message_from_row({**message_values(m, turn.run_id), "seq": seq})
            for m, seq in zip(new, seqs, strict=True)
        )
        limit = self.limits.max_messages
        if limit is not None and len(turn.stored) > limit:
            del turn.stored[:-limit]  # a read takes the newest `max_messages` only
