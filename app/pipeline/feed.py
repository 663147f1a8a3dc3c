"""What watchers of a session (the browser gateway, across replicas) are told, after each commit.

Messages go out once they are committed; answer deltas while the model streams. A write
whose statement saw no replica watch the key (`remote=False`) is only published here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.bus import SessionBus
from app.sessions.messages import ChatMessage


class SessionFeed:
    def __init__(self, bus: SessionBus | None) -> None:
        self.bus = bus

    @property
    def streams(self) -> bool:
        """Whether anyone could watch answer deltas."""
        return self.bus is not None

    async def messages(
        self,
        key: str,
        session_id: int,
        new: Sequence[ChatMessage],
        seqs: Sequence[int],
        *,
        run_id: int | None = None,
        remote: bool = True,
    ) -> None:
        if self.bus is None:
            return
        for msg, seq in zip(new, seqs, strict=True):
            await self.bus.publish(
                key,
                {
                    "type": "message",
                    "session_key": key,
                    "session_id": session_id,
                    "seq": seq,
                    "role": msg.role,
                    "content": msg.content,
                    "tool_calls": list(msg.tool_calls) if msg.tool_calls else None,
                    "tool_call_id": msg.tool_call_id,
                    "name": msg.name,
                    "event_id": msg.event_id,
                    "run_id": run_id,
                },
                remote=remote,
            )

    async def delta(self, key: str, run_id: int, text: str, *, remote: bool = True) -> None:
        if self.bus is not None:
            payload = {"type": "delta", "session_key": key, "run_id": run_id, "text": text}
            await self.bus.publish(key, payload, remote=remote)

    async def event(self, key: str, kind: str, **values: Any) -> None:
        """Anything else the watchers show (an approval asked for, decided)."""
        if self.bus is not None:
            await self.bus.publish(key, {"type": kind, "session_key": key, **values})
