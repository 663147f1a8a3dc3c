"""One log line per key and interval, with the count of what was held back.

A wrong secret on a platform's side makes every one of its requests fail the same way:
the operator must hear of it (a 401 answered in silence looks like an idle bot), but
once a minute is enough, not a line per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class LogThrottle:
    """`due(key)` answers how many calls for `key` were held back since the last line
    (0 for the first), or None while the interval since that line has not passed."""

    def __init__(self, interval_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval_seconds
        self.clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, key: str) -> int | None:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)
