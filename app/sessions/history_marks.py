"""Turns taken out of the model's window by /undo and /retry, without deleting anything.

History is append-only. `/undo` and `/retry` leave a marker on the session
(`sessions.metadata["hidden"]`: the seq range of the turn, why, by whom, when); the
messages stay in the history (the admin API and exports still show them) and `visible`
drops them from what the model is sent. A retried turn's old answer is marked
`superseded`, an undone one `undone`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from app.sessions.messages import ChatMessage

HIDDEN = "hidden"


def hidden_ranges(metadata: Mapping[str, Any]) -> list[tuple[int, int]]:
    return [(int(m["from"]), int(m["to"])) for m in metadata.get(HIDDEN) or ()]


def is_hidden(seq: int | None, ranges: Sequence[tuple[int, int]]) -> bool:
    return seq is not None and any(lo <= seq <= hi for lo, hi in ranges)


def visible(messages: Sequence[ChatMessage], metadata: Mapping[str, Any]) -> list[ChatMessage]:
    """`messages` without those in a turn marked undone or superseded."""
    ranges = hidden_ranges(metadata)
    if not ranges:
        return list(messages)
    return [m for m in messages if not is_hidden(m.seq, ranges)]


def last_turn(messages: Sequence[ChatMessage], metadata: Mapping[str, Any]) -> tuple[ChatMessage, int] | None:
    """The newest visible user message and the seq of the turn's last message."""
    shown = [m for m in visible(messages, metadata) if m.seq is not None]
    for index in range(len(shown) - 1, -1, -1):
        if shown[index].role == "user":
            return shown[index], int(shown[-1].seq or 0)
    return None


def mark(metadata: Mapping[str, Any], lo: int, hi: int, *, why: str, by: str, at: datetime) -> dict[str, Any]:
    """`metadata` with the turn `lo..hi` marked hidden (a new dict)."""
    marker = {"from": lo, "to": hi, "why": why, "by": by, "at": at.isoformat()}
    return {**metadata, HIDDEN: [*(metadata.get(HIDDEN) or ()), marker]}
