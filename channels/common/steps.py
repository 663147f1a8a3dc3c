"""A reply as outbox steps: its text in chunks, then each medium whose bytes we hold.

The outbound seams of the adapters that send a reply piece by piece share this.
`Steps` keeps, per outbox message, how many steps went out (`ChunkProgress`), so a
retried reply never sends a step twice, whoever (the adapter's `send` or a streamer's
`finish`) sent it first; `reply` runs the steps of one reply and names its platform id.
`StepSender` is the whole `send` of a seam that can deliver any one step on its own
(Discord, Feishu, DingTalk): it says how to cut the text and how to send step `index`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from app.channel import SendResult
from app.events import FilePart, ImagePart, OutboundMessage
from channels.common.chunks import ChunkProgress, send_chunks

T = TypeVar("T")


def held_media(message: OutboundMessage) -> list[ImagePart | FilePart]:
    """Parts whose bytes we hold, each one upload; a part with only a URL stays in the text."""
    return [p for p in message.parts if isinstance(p, (ImagePart, FilePart)) and p.data_base64]


class Steps:
    def __init__(self) -> None:
        self._progress = ChunkProgress(capacity=1000)  # steps already sent, per outbox message

    async def steps(
        self, message_id: str, items: list[str], deliver: Callable[[int, str], Awaitable[T]]
    ) -> list[T]:
        """`deliver` each item not yet sent for this outbox message (`send_chunks`)."""
        return await send_chunks(self._progress, message_id, items, deliver)

    async def reply(
        self,
        message_id: str,
        chunks: Sequence[str],
        media_count: int,
        deliver: Callable[[int, str], Awaitable[str | None]],
        *,
        shown: str | None = None,
    ) -> SendResult:
        """The text's chunks, then `media_count` media (items `file:<i>`), each sent once.

        The reply's platform id is the first a step returned, else `shown` (the preview
        that became the answer)."""
        items = [*chunks, *(f"file:{i}" for i in range(media_count))]
        sent = await self.steps(message_id, items, deliver)
        return SendResult(platform_message_id=next((m for m in sent if m), shown))


class StepSender(Steps, ABC):
    @abstractmethod
    def chunks(self, message: OutboundMessage) -> list[str]:
        """The reply's text cut within the platform's limit (`split_text`)."""

    @abstractmethod
    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str | None:
        """One step: text chunk `index`, or (past the text) medium `index - len(chunks)`."""

    async def send(self, message: OutboundMessage) -> SendResult:
        """The whole reply: its text in chunks, then its media; each step sent once."""
        chunks, media = self.chunks(message), held_media(message)

        async def deliver(index: int, _item: str) -> str | None:
            return await self.deliver_step(message, index, chunks, media)

        return await self.reply(message.message_id, chunks, len(media), deliver)
