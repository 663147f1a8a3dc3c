"""One conversation's preview while its turn runs: what it shows and the tasks showing it.

`PreviewHub` (`app.streaming.hub`) keeps one `Stream` per session key and drives it from
the session feed; `Stream.view` is the text the preview shows now.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.events import InboundEvent
from app.streaming.protocol import Streamer


@dataclass(frozen=True)
class StreamTexts:
    """The preview's own words, per locale (`ChannelSettings.locale`)."""

    still_working: Mapping[str, str] = field(
        default_factory=lambda: {"en": "⏳ Still working…", "zh": "⏳ 仍在处理…"}
    )
    tool_running: str = "🔧 {name} …"
    tool_done: str = "🔧 {name} ✓"

    def working(self, locale: str) -> str:
        return self.still_working.get(locale, self.still_working["en"])


@dataclass
class Stream:
    key: str
    channel: str
    streamer: Streamer
    locale: str
    started: float = field(default_factory=time.monotonic)
    event: InboundEvent | None = None  # the event the answer replies to
    run_id: int | None = None
    latest: str | None = None  # the newest event id among those that started the turn
    text: str = ""
    tools: list[list[Any]] = field(default_factory=list)  # [name, done]
    shown: str = ""
    preview_id: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    typing: asyncio.Task[None] | None = None

    def view(self, texts: StreamTexts, still_working_after: float) -> str:
        lines = [
            (texts.tool_done if done else texts.tool_running).format(name=name) for name, done in self.tools
        ]
        if self.text.strip():
            lines.append(self.text.strip())
        elif time.monotonic() - self.started >= still_working_after:
            lines.append(texts.working(self.locale))
        view = "\n".join(lines)
        limit = self.streamer.max_preview_chars
        return view if len(view) <= limit else view[: limit - 1] + "…"
