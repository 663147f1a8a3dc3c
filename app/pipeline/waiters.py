"""Waiting for an event's replies (the webhook's `?wait=true`, the CLI, A2A).

A waiter asks the store whether the event is handled and reads its replies; in between it
sleeps until this process handles the event (`wake`) or a poll interval passes (another
replica may handle it). A turn that handled the event here hands the result over with the
wake-up, so the waiter need not read it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from app.channel import WaitResult
from app.pipeline.storage.port import PipelineStore

# How many events accepted here and not yet handled are remembered (`accepted`).
_UNHANDLED_LIMIT = 10_000


class Waiters:
    def __init__(self, store: PipelineStore) -> None:
        self.store = store
        self._waiters: dict[str, asyncio.Event] = {}
        # Events accepted here and not yet handled here: a waiter need not ask the
        # database before the first wake-up (bounded; other replicas' work is polled).
        self._unhandled: OrderedDict[str, None] = OrderedDict()
        self._known: dict[str, WaitResult] = {}

    def accepted(self, event_id: str) -> None:
        """The event was stored just now by this process."""
        self._unhandled[event_id] = None
        if len(self._unhandled) > _UNHANDLED_LIMIT:
            self._unhandled.popitem(last=False)

    def wake(self, event_ids: Sequence[str], *, result: WaitResult | None = None) -> None:
        """The events were handled; `result`: what a waiter would read, known without asking."""
        for event_id in event_ids:
            self._unhandled.pop(event_id, None)
            waiter = self._waiters.get(event_id)
            if waiter is not None:
                if result is not None:
                    self._known[event_id] = result
                waiter.set()

    async def wait_for_replies(self, event_id: str, timeout: float, poll: float = 0.2) -> WaitResult:
        """Wait until the event is handled (here or on another replica) and return its replies."""
        waiter = self._waiters.setdefault(event_id, asyncio.Event())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ask = event_id not in self._unhandled
        try:
            while True:
                result = self._known.pop(event_id, None)
                if result is None and ask:
                    result = await self.store.replies_if_done(event_id)
                if result is not None:
                    return result
                ask = True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return WaitResult(done=False)
                try:
                    # Not `wait_for`: its extra task costs loop iterations after the wake-up.
                    async with asyncio.timeout(min(poll, remaining)):
                        await waiter.wait()
                except TimeoutError:
                    pass
                waiter.clear()
        finally:
            self._waiters.pop(event_id, None)
            self._known.pop(event_id, None)
