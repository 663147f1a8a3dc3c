"""Attempts per sender in a fixed window: guessing a code costs time, not only luck.

`/link CODE` and the pairing-code requests of unknown senders are counted per sender in the
shared counters (`QuotaCounters`, every replica sees the same counts); over the limit an
attempt is refused without looking at the code or minting one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.counters import QuotaCounters, window_of


class Attempts:
    def __init__(
        self,
        engine: AsyncEngine,
        metric: str,
        *,
        limit: int,
        window_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.counters = QuotaCounters(engine)
        self.metric = metric  # at most 16 characters (access_counters.metric)
        self.limit = limit
        self.window_seconds = window_seconds
        self.clock = clock

    async def allow(self, subject: str) -> bool:
        """Count one attempt of `subject`; whether it is within the limit."""
        window = window_of(self.clock(), self.window_seconds)
        counts = await self.counters.add(self.metric, {subject[:800]: 1}, window)
        return counts[subject[:800]] <= self.limit
