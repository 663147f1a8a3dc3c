"""Dead letters you can act on: list, retry once more, or discard (`store.py`)."""

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["BadDeadLetterId", "DeadLetterFilter", "DeadLetters", "Resolved", "parse_id"]
