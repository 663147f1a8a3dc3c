"""Splitting long replies into Telegram-sized messages (Telegram counts UTF-16 units)."""

from __future__ import annotations

from channels.common import chunks


def utf16_len(text: str) -> int:
    """Telegram measures message length in UTF-16 code units (emoji count twice)."""
    return len(text.encode("utf-16-le")) // 2


def split_text(text: str, limit: int) -> list[str]:
    """Cut `text` into chunks of at most `limit` UTF-16 units, preferring line, then word breaks.

    Joining the chunks gives back the text (breaks stay at the end of a chunk; chunks that
    are only whitespace are dropped, Telegram refuses empty messages).
    """
    return chunks.split_text(text, limit, units=utf16_len)
