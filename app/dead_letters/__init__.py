"""Dead letters you can act on: list, retry once more, or discard (`store.py`)."""

from app.dead_letters.store import BadDeadLetterId, DeadLetterFilter, DeadLetters, Resolved, parse_id

__all__ = ["BadDeadLetterId", "DeadLetterFilter", "DeadLetters", "Resolved", "parse_id"]
