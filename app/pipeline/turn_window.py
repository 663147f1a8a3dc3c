"""What a turn sends the model: which model serves it, and which part of its history.

The model: `/model`'s choice stored on the session, else the serving agent's model, else
the channel's. The window: the session's newest messages after `last_consolidated`, cut to
a legal suffix within the limits, without the turns `/undo` and `/retry` marked hidden.
While a run works, its session stays active (`app.sessions.heartbeat`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager

from sqlalchemy.ext.asyncio import AsyncEngine

from app.events import InboundEvent
from app.pipeline.storage.port import PipelineStore
from app.pipeline.turn_state import TurnState, WindowLimits
from app.sessions.heartbeat import heartbeat
from app.sessions.history_marks import hidden_ranges, visible
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, message_from_row, message_values
from app.sessions.window import trim_to_legal_window


class TurnWindow:
    def __init__(
        self,
        store: PipelineStore,
        limits: WindowLimits,
        models: Mapping[str, str | None] | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.models = dict(models or {})  # each channel's model
        # The serving agent's model (app.agents), between /model's choice and the channel's.
        self.agent_model: Callable[[InboundEvent], str | None] = lambda event: None
        # Set by the runtime: refresh last_active_at while a run works (0: off).
        self.heartbeat_engine: AsyncEngine | None = None
        self.heartbeat_seconds = 0.0

    def model(self, session: SessionState, event: InboundEvent) -> str | None:
        """/model's choice for the session, else the agent's model, else the channel's."""
        chosen = session.metadata.get("model")
        return chosen or self.agent_model(event) or self.models.get(event.channel)

    def beat(self, session_id: int) -> AbstractAsyncContextManager[None]:
        """A long run keeps its session active while it works."""
        return heartbeat(self.heartbeat_engine, session_id, self.heartbeat_seconds)

    async def load(self, turn: TurnState) -> list[ChatMessage]:
        """The turn's window as the model should see it now."""
        limits = self.limits
        # Turns marked undone/superseded (/undo, /retry) stay stored but are not sent.
        marks = turn.session.metadata
        if turn.stored is not None:  # what `SessionStore.load_window` would read now
            return trim_to_legal_window(
                visible(turn.stored, marks),
                max_messages=limits.max_messages,
                max_tokens=limits.max_tokens,
            )
        window = await self.store.sessions.load_window(
            turn.session, max_messages=limits.max_messages, max_tokens=limits.max_tokens
        )
        return trim_to_legal_window(visible(window, marks)) if hidden_ranges(marks) else window

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
