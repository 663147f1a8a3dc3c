"""Notes the model reads along with the history: what happened on the platform between turns.

A platform-native event that the model should know of but that is no message of its own
(an answered message edited, a reaction) leaves a note on the session
(`sessions.metadata["notes"]`: the text, and the seq of the next message at the time),
appended like the hidden marks of `history_marks`; nothing in the history is rewritten.
`with_notes` puts each note, as a user message labelled as a platform note, right before
the first user message at or after its seq, so a window stays legal (a note never sits
between an assistant's tool calls and their results) and the model sees it from the next
turn on. A note whose place is before the window is not shown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from app.sessions.messages import ChatMessage

NOTES = "notes"
NOTES_KEPT = 50  # the newest notes a session keeps


def add_note(metadata: Mapping[str, Any], text: str, *, before: int, at: datetime) -> dict[str, Any]:
    """`metadata` with a note for the messages from seq `before` on (a new dict)."""
    notes = [*(metadata.get(NOTES) or ()), {"before": before, "text": text, "at": at.isoformat()}]
    return {**metadata, NOTES: notes[-NOTES_KEPT:]}


def with_notes(window: Sequence[ChatMessage], metadata: Mapping[str, Any]) -> list[ChatMessage]:
    """`window` with the session's notes placed before the user messages they precede."""
    notes = [n for n in metadata.get(NOTES) or () if isinstance(n, dict)]
    if not notes or not window:
        return list(window)
    first = next((m.seq for m in window if m.seq is not None), None)
    out: list[ChatMessage] = []
    pending = sorted(
        (n for n in notes if first is None or int(n.get("before", 0)) >= first),
        key=lambda n: int(n.get("before", 0)),
    )
    for message in window:
        if message.role == "user" and message.seq is not None:
            while pending and int(pending[0].get("before", 0)) <= message.seq:
                out.append(_note_message(str(pending.pop(0).get("text", ""))))
        out.append(message)
    return out


def _note_message(text: str) -> ChatMessage:
    return ChatMessage(role="user", content=f"[platform note, not a message] {text}")
