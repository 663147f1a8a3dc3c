"""Splitting long replies into Slack-sized messages (Slack counts characters)."""

from __future__ import annotations

from channels.common import chunks


def split_text(text: str, limit: int) -> list[str]:
    """Cut `text` into chunks of at most `limit` characters, preferring line, then word breaks.

    Breaks stay at the end of a chunk; chunks that are only whitespace are dropped (Slack
    refuses empty messages).
    """
    return chunks.split_text(text, limit)
