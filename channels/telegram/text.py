"""Splitting long replies into Telegram-sized messages."""

from __future__ import annotations


def utf16_len(text: str) -> int:
    """Telegram measures message length in UTF-16 code units (emoji count twice)."""
    return len(text.encode("utf-16-le")) // 2


def split_text(text: str, limit: int) -> list[str]:
    """Cut `text` into chunks of at most `limit` UTF-16 units, preferring line, then word breaks.

    Joining the chunks gives back the text (breaks stay at the end of a chunk; chunks that
    are only whitespace are dropped, Telegram refuses empty messages).
    """
    chunks: list[str] = []
    rest = text
    while rest:
        if utf16_len(rest) <= limit:
            chunks.append(rest)
            break
        cut = _fit(rest, limit)
        window = rest[:cut]
        for sep in ("\n\n", "\n", " "):
            at = window.rfind(sep)
            if at >= cut // 2:  # do not make tiny chunks just to break at a separator
                cut = at + len(sep)
                break
        chunks.append(rest[:cut])
        rest = rest[cut:]
    return [c for c in chunks if c.strip()]


def _fit(text: str, limit: int) -> int:
    """The longest prefix length (in characters) within `limit` UTF-16 units."""
    units = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > limit:
            return max(1, index)
    return len(text)
