"""The dispatcher's run slots: a bound on concurrent runs that a worker can hand on.

Like a semaphore, slots go to keys in the order they asked. A worker whose turn's end
releases its key's lease can also hand its slot straight to the longest waiting key,
together with that key's lease, which the same statement took (`fused.finish`,
`successor`): the key then starts without a statement of its own to take its lease.
Under load, when keys queue for slots, that is most of the leases taken.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")


class RunSlots(Generic[T]):
    """`size` slots; `take` waits for one and returns what came with it (a `T`, or None)."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: OrderedDict[str, asyncio.Future[T | None]] = OrderedDict()
        self._picked: dict[str, asyncio.Future[T | None]] = {}

    def try_take(self) -> bool:
        """A free slot now, if there is one and nobody waits for one."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return True
        return False

    async def take(self, key: str) -> T | None:
        """Wait for a slot for `key` (one waiter per key); returns what was handed with it."""
        if self.try_take():
            return None
        waiter: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiter
        try:
            return await waiter
        except asyncio.CancelledError:
            if self._waiting.get(key) is waiter:
                del self._waiting[key]
            elif waiter.done() and not waiter.cancelled():
                self.release()  # given a slot as it was cancelled: the next waiter's
            raise

    def release(self) -> None:
        """Give a slot back: to the longest waiting key, or free."""
        while self._waiting:
            _, waiter = self._waiting.popitem(last=False)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def pick(self) -> str | None:
        """The longest waiting key, out of line until `hand` or `put_back` (None: nobody waits)."""
        if not self._waiting:
            return None
        key, waiter = self._waiting.popitem(last=False)
        self._picked[key] = waiter
        return key

    def hand(self, key: str, value: T | None) -> bool:
        """Give the caller's slot to the picked `key`, with `value`; False if its waiter is gone.

        A waiter is only gone when the dispatcher stops: the slot goes to the next one then,
        and a lease handed with it is left to expire.
        """
        waiter = self._picked.pop(key)
        if waiter.done():
            self.release()
            return False
        waiter.set_result(value)
        return True

    def put_back(self, key: str) -> None:
        """The picked `key` gets no slot now: first in line again."""
        waiter = self._picked.pop(key)
        if not waiter.done():
            self._waiting[key] = waiter
            self._waiting.move_to_end(key, last=False)
