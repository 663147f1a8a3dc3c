"""A streamer whose final answer gets the adapter's finishing touch (docs/events.md).

When a turn streamed a preview, its answer is the preview's last edit (`Streamer.finish`),
not a send: what an adapter adds to a sent reply — approve/deny buttons on an approval
prompt, the answer to a button press — is added here after the finish too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.channel import SendResult
from app.events import OutboundMessage
from app.streaming.protocol import CardEdits, Streamer

AfterSend = Callable[[OutboundMessage, SendResult], Awaitable[None]]


class AfterFinish:
    def __init__(self, inner: Streamer, after: AfterSend) -> None:
        self.inner = inner
        self.after = after

    @property
    def edit_interval(self) -> float:
        return self.inner.edit_interval

    @property
    def max_preview_chars(self) -> int:
        return self.inner.max_preview_chars

    async def typing(self, message: OutboundMessage) -> None:
        await self.inner.typing(message)

    def edits_card(self, preview_id: str) -> bool:
        inner = self.inner
        return isinstance(inner, CardEdits) and inner.edits_card(preview_id)

    async def open(self, message: OutboundMessage) -> str:
        return await self.inner.open(message)

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        await self.inner.edit(message, preview_id)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        result = await self.inner.finish(message, preview_id)
        await self.after(message, result)
        return result
