"""Quota limits: from a channel's settings or an agent's profile (`quota_*` fields)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class QuotaLimits:
    """Limits of one channel or one agent; None is no limit."""

    sender_messages_per_minute: int | None = None
    session_messages_per_minute: int | None = None
    sender_tokens_per_day: int | None = None
    session_tokens_per_day: int | None = None

    @classmethod
    def of(cls, source: Any) -> QuotaLimits:
        """Read `quota_<name>` attributes of settings or a profile (ints, or None)."""
        values: dict[str, int | None] = {}
        for f in fields(cls):
            raw = getattr(source, f"quota_{f.name}", None)
            if raw is not None:
                value = int(raw)
                if value < 1:
                    raise ValueError(f"quota_{f.name} must be at least 1, got {raw!r}")
                values[f.name] = value
        return cls(**values)

    @cached_property  # asked three times per event; the limits never change
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


def strictest(*limits: int | None) -> int | None:
    given = [n for n in limits if n is not None]
    return min(given) if given else None
