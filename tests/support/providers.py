"""Providers for tests: real implementations of the ChatProvider protocol that record calls.

They stand in for the model (an external system), never for chatgate's own code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.agent.provider import ProviderReply, ToolSpec
from app.sessions.messages import ChatMessage


@dataclass
class Call:
    user_text: str
    messages: list[ChatMessage]
    started: float
    finished: float = 0.0


@dataclass
class RecordingProvider:
    """Answers `echo <last user text>` after `delay` seconds and records every call."""

    delay: float = 0.0
    name: str = "recording"
    # With `together` set, a call first waits (up to `patience` seconds) until that many
    # calls have been active at once: a bound on concurrent runs is then reached whatever
    # the machine's load, instead of only when the runs happen to overlap.
    together: int = 0
    patience: float = 10.0
    # With `hold` set, a call answers only once it is set (what the test waits to see first).
    hold: asyncio.Event | None = None
    calls: list[Call] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    active: int = 0
    max_active: int = 0

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        user = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
        call = Call(user_text=user, messages=list(messages), started=time.monotonic())
        self.calls.append(call)
        self.events.append(("start", user))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            deadline = time.monotonic() + self.patience
            while self.max_active < self.together and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(self.delay)
            if self.hold is not None:
                await asyncio.wait_for(self.hold.wait(), self.patience)
        finally:
            self.active -= 1
            call.finished = time.monotonic()
            self.events.append(("finish", user))
        return ProviderReply(content=f"echo {user}")

    async def aclose(self) -> None:
        return None
