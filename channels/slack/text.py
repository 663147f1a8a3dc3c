"""Splitting long replies into Slack-sized messages."""

from __future__ import annotations


def split_text(text: str, limit: int) -> list[str]:
    """Cut `text` into chunks of at most `limit` characters, preferring line, then word breaks.

    Breaks stay at the end of a chunk; chunks that are only whitespace are dropped (Slack
    refuses empty messages).
    """
    chunks: list[str] = []
    rest = text
    while rest:
        if len(rest) <= limit:
            chunks.append(rest)
            break
        cut = limit
        window = rest[:cut]
        for sep in ("\n\n", "\n", " "):
            at = window.rfind(sep)
            if at >= cut // 2:  # do not make tiny chunks just to break at a separator
                cut = at + len(sep)
                break
        chunks.append(rest[:cut])
        rest = rest[cut:]
    return [c for c in chunks if c.strip()]
