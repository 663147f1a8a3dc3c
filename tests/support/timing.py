"""Waiting in tests: one `eventually()` and one scale for every fixed deadline.

A deadline in a test is a bound on how long a correct system may take, not an expected
duration; on a loaded machine (load 10-15 on two cores) the correct system takes longer.
`TEST_TIME_SCALE` (environment, default 1) multiplies every such bound, so one setting makes
the suite pass there without making the quiet-machine run slower: waits end at the event.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable

__all__ = ["eventually", "scaled", "time_scale"]


def time_scale() -> float:
    """`TEST_TIME_SCALE` from the environment (read on each call so a test may set it)."""
    raw = os.environ.get("TEST_TIME_SCALE", "").strip()
    if not raw:
        return 1.0
    value = float(raw)
    if value <= 0:
        raise ValueError(f"TEST_TIME_SCALE must be > 0, got {raw!r}")
    return value


def scaled(seconds: float) -> float:
    """A fixed deadline of `seconds` on a quiet machine, scaled for this one."""
    return seconds * time_scale()


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "condition not met in time",
) -> None:
    """Wait until `check()` (plain or async) is true; fail after `scaled(timeout)` seconds.

    The check runs once more at the deadline, so a condition met during the last sleep passes.
    """
    loop = asyncio.get_running_loop()
    limit = scaled(timeout)
    deadline = loop.time() + limit
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"{message} (within {limit:g} s)")
        await asyncio.sleep(interval)
