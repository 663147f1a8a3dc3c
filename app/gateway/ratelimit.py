"""How many messages a browser connection, and a subject over all its connections, may send.

A sliding window of one minute, kept in this process: each `send` is an agent turn, so
one client must not be able to queue thousands of them. With several replicas a subject
gets its limit on each replica it is connected to.
"""

from __future__ import annotations

import math
import time
from collections import deque

WINDOW_SECONDS = 60.0


class SendRate:
    """At most `limit` sends within any `WINDOW_SECONDS`."""

    def __init__(self, limit: int, window: float = WINDOW_SECONDS) -> None:
        self.limit = limit
        self.window = window
        self._times: deque[float] = deque()

    def _trim(self, now: float) -> None:
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()

    def retry_after(self, now: float | None = None) -> float | None:
        """None when one more send fits now, else the seconds until it would."""
        now = time.monotonic() if now is None else now
        self._trim(now)
        if len(self._times) < self.limit:
            return None
        return max(0.001, self.window - (now - self._times[0]))

    def record(self, now: float | None = None) -> None:
        self._times.append(time.monotonic() if now is None else now)

    @property
    def idle(self) -> bool:
        self._trim(time.monotonic())
        return not self._times


class SubjectRates:
    """One `SendRate` per subject, forgotten once idle."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rates: dict[str, SendRate] = {}

    def get(self, subject: str) -> SendRate:
        rate = self._rates.get(subject)
        if rate is None:
            if len(self._rates) > 10_000:
                for name in [n for n, r in self._rates.items() if r.idle]:
                    del self._rates[name]
            rate = self._rates[subject] = SendRate(self.limit)
        return rate


def seconds_text(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
