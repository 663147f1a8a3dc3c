"""Long replies as several platform-sized messages, delivered once each.

`split_text` cuts a reply within a platform's limit, measured in the platform's own unit
(characters for Slack, UTF-16 code units for Telegram). `ChunkProgress` remembers how many
chunks of a message went out, and `send_chunks` uses it so that an outbox retry after a
partial send does not repeat them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

# Paragraph, then line, then word breaks.
_SEPARATORS = ("\n\n", "\n", " ")


def split_text(text: str, limit: int, *, units: Callable[[str], int] = len) -> list[str]:
    """Cut `text` into chunks of at most `limit` units, preferring paragraph, line, then word breaks.

    `units` measures a string in the platform's unit. Breaks stay at the end of a chunk;
    chunks that are only whitespace are dropped (platforms refuse empty messages), so
    joining the chunks gives back the text but for those.
    """
    chunks: list[str] = []
    rest = text
    while rest:
        if units(rest) <= limit:
            chunks.append(rest)
            break
        cut = _fit(rest, limit, units)
        window = rest[:cut]
        for sep in _SEPARATORS:
            at = window.rfind(sep)
            if at >= cut // 2:  # do not make tiny chunks just to break at a separator
                cut = at + len(sep)
                break
        chunks.append(rest[:cut])
        rest = rest[cut:]
    return [c for c in chunks if c.strip()]


def _fit(text: str, limit: int, units: Callable[[str], int]) -> int:
    """The longest prefix length (in characters) within `limit` units; at least one character."""
    total = 0
    for index, char in enumerate(text):
        total += units(char)
        if total > limit:
            return max(1, index)
    return len(text)


class ChunkProgress:
    """How many chunks of a split message were delivered, per outbox message id.

    A message split in several API calls may fail half-way; the outbox then retries the
    whole message. Remembering the delivered chunks (in this process, bounded, least
    recently recorded dropped first) keeps the retry from sending the first ones twice; a
    restart forgets them, and a retry may then repeat a chunk.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._done: dict[str, int] = {}
        self._capacity = capacity

    def delivered(self, message_id: str) -> int:
        return self._done.get(message_id, 0)

    def record(self, message_id: str, count: int) -> None:
        self._done.pop(message_id, None)
        self._done[message_id] = count
        while len(self._done) > self._capacity:
            self._done.pop(next(iter(self._done)))

    def forget(self, message_id: str) -> None:
        self._done.pop(message_id, None)


async def send_chunks(
    progress: ChunkProgress,
    message_id: str,
    chunks: Sequence[str],
    send: Callable[[int, str], Awaitable[T]],
) -> list[T]:
    """`send(index, chunk)` each chunk not yet delivered, in order; their results.

    Progress is recorded after every chunk, so when `send` raises, the outbox's retry of
    the message starts at the chunk that failed.
    """
    results: list[T] = []
    for index in range(progress.delivered(message_id), len(chunks)):
        results.append(await send(index, chunks[index]))
        progress.record(message_id, index + 1)
    progress.forget(message_id)
    return results
