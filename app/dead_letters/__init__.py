"""Dead letters you can act on: list, retry once more, or discard (`store.py`)."""

from typing import TYPE_CHECKING

from app.lazy_names import lazy_names

if TYPE_CHECKING:
    from app.dead_letters.store import BadDeadLetterId, DeadLetterFilter, DeadLetters, Resolved, parse_id

# Loaded on first use (PEP 562): `chatgate` imports this package for its command's parser
# on every start, and the names' modules pull in SQLAlchemy and more.
_EXPORTS = {
    "BadDeadLetterId": "app.dead_letters.store",
    "DeadLetterFilter": "app.dead_letters.store",
    "DeadLetters": "app.dead_letters.store",
    "Resolved": "app.dead_letters.store",
    "parse_id": "app.dead_letters.store",
}

__getattr__ = lazy_names(__name__, _EXPORTS)


__all__ = ["BadDeadLetterId", "DeadLetterFilter", "DeadLetters", "Resolved", "parse_id"]
