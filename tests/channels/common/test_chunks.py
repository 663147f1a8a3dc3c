"""The shared splitter and chunk delivery: limits in the platform's unit, resuming a retry."""

from __future__ import annotations

import pytest

from app.errors import ChannelUnavailable
from channels.common.chunks import ChunkProgress, send_chunks, split_text


def test_limit_is_measured_in_the_given_units() -> None:
    def utf8(text: str) -> int:
        return len(text.encode())

    assert split_text("字" * 10, 10) == ["字" * 10]
    assert split_text("字" * 10, 10, units=utf8) == ["字" * 3, "字" * 3, "字" * 3, "字"]


def test_a_character_wider_than_the_limit_still_makes_progress() -> None:
    assert split_text("😀😀", 1, units=lambda s: 2 * len(s)) == ["😀", "😀"]


async def test_a_retry_after_a_partial_send_starts_at_the_chunk_that_failed() -> None:
    progress = ChunkProgress()
    sent: list[str] = []
    fail_at = {2}

    async def send(index: int, chunk: str) -> int:
        if index in fail_at:
            fail_at.clear()
            raise ChannelUnavailable("down")
        sent.append(chunk)
        return index

    with pytest.raises(ChannelUnavailable):
        await send_chunks(progress, "m1", ["a", "b", "c", "d"], send)
    assert progress.delivered("m1") == 2
    assert await send_chunks(progress, "m1", ["a", "b", "c", "d"], send) == [2, 3]
    assert sent == ["a", "b", "c", "d"]
    assert progress.delivered("m1") == 0  # forgotten once the message is complete


def test_progress_keeps_the_most_recently_recorded_messages() -> None:
    progress = ChunkProgress(capacity=2)
    progress.record("a", 1)
    progress.record("b", 1)
    progress.record("a", 2)
    progress.record("c", 1)
    assert [progress.delivered(m) for m in ("a", "b", "c")] == [2, 0, 1]
